"""The config schema's types: typed rules, fields and sections (layer 0, so every layer declares its own).

A section is declared once, next to the code that reads it (`client` in optimizers/client.py, `server` in
optimizers/server.py, `engine` in core/engine.py, `swa` in optimizers/schedules.py (its cyclic lr is read there,
its averaging by algorithms/wrappers/swa.py), `wima` in algorithms/wrappers/wima.py, the run's own fields and the
other sections in config/schema.py); an algorithm's `config.algo` is its `hparams=` rules (algorithms/registry.py):

    SECTION = Section('client', (
        Field('lr', Number(0.01, lo=0, lo_open=True, steps=True), 'client learning rate', {VALUE, RESULT}),
        ...), check=cross_field_fn)

A rule carries the field's default and says why a value is refused (`why_not(v) -> None | reason`); the reason
is the text after 'config.<path>=<value>: ' (errors.ConfigError). The rules:

    Number(default, lo=, hi=, lo_open=, hi_open=, integer=, steps=, bound=, finite=, note=)
        steps=True (the config sections): 'must be a number' | 'an integer', then 'must be a finite number',
        then 'must be >= lo' / '> lo' / '<= hi' / '< hi', each its own message. steps=False (config.algo):
        one message 'must be a number in [lo, inf)' (bound=True: 'must be a number >= lo') + note.
    Integer(default, lo=, note=)    'must be an integer >= lo' + note (config.algo)
    Flag(default)                   True or False ('must be True or False', or `message`)
    Choice(default, allowed, note=, sort=)   one of `allowed` ('allowed values: [...]' in the given order,
                                    or sorted; `allowed` may be a function: a registry's names)
    String(default, message)        a str
    Pair(default, ...)              two numbers / integers (or () where allowed)
    Test(default, ok, message)      anything else a field allows, as a predicate (e.g. 'auto' or an int >= 1)

Tags say what kind a field is, once; the tables other modules use are derived from them (`tagged`):

    RESULT     the value changes what is computed: a checkpoint of another value is refused
               (training/checkpoint.COMPUTATION_FIELDS: the top-level names holding such fields)
    RESUME     may change on resume with a warning (checkpoint.WARN_FIELDS): the round budget, the engine
    SAME_BITS  gives bit-identical results (checkpoint.SAME_RESULT_FIELDS: no resume warning)
    EXECUTION  says how a run was executed or recorded, not what was run (sweeps/report.EXECUTION_KEYS)
    VALUE      a per-run traced value of a batched program (core/runs.VALUE_FIELDS)
    INPUT      a per-run input of a batched program: its key, its partition (core/runs.INPUT_FIELDS)
    TRUTH      zero / non-zero changes the program's structure: the truth stays static (core/runs.STATIC_TRUTH)
    LOG        changes neither the computation nor a batched program's block schedule (core/runs.IGNORED_FIELDS)
    WHOLE      a section a config replaces whole (config/default_config.WHOLE_SECTIONS)

A section's own tags apply to the section as a whole (`tagged` then names the section, not its fields).
"""
from __future__ import annotations

import abc
import dataclasses
import math
import numbers
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import ml_collections

from fedjax_flat.errors import ConfigError

RESULT = 'result'
RESUME = 'resume'
SAME_BITS = 'same_bits'
EXECUTION = 'execution'
VALUE = 'value'
INPUT = 'input'
TRUTH = 'truth'
LOG = 'log'
WHOLE = 'whole'
TAGS = (RESULT, RESUME, SAME_BITS, EXECUTION, VALUE, INPUT, TRUTH, LOG, WHOLE)


def is_number(v, integer: bool = False) -> bool:
  """A real (or integral) number that is not a bool."""
  return not isinstance(v, bool) and isinstance(v, numbers.Integral if integer else numbers.Number)


@dataclasses.dataclass(frozen=True)
class Rule(abc.ABC):
  default: Any

  @abc.abstractmethod
  def why_not(self, v) -> Optional[str]:
    """None when v is allowed, else the reason (the text after '<field>=<v>: ')."""

  def describe(self) -> str:
    """What the rule allows, for the field reference (configs/README.md)."""
    return ''


def _interval(lo, hi, lo_open, hi_open) -> str:
  left = '-inf' if lo is None else lo
  return (f'{"(" if lo_open or lo is None else "["}{left}, {hi if hi is not None else "inf"}'
          f'{")" if hi_open or hi is None else "]"}')


@dataclasses.dataclass(frozen=True)
class Number(Rule):
  lo: Optional[float] = None
  hi: Optional[float] = None
  lo_open: bool = False
  hi_open: bool = False
  bound: bool = False           # message 'must be a number >= lo' instead of the interval
  finite: bool = False          # refuse inf / nan (and say 'finite' in the message)
  note: str = ''
  integer: bool = False         # an integral number (steps=True)
  steps: bool = False           # type, finiteness and each bound its own message (the config sections)
  kind_message: str = ''        # steps: one message for a wrong type and a non-finite value

  def why_not(self, v):
    lo, hi = self.lo, self.hi
    if self.steps:
      if not is_number(v, self.integer):
        return self.kind_message or f'must be {"an integer" if self.integer else "a number"}' + self.note
      if not math.isfinite(v):
        return self.kind_message or 'must be a finite number' + self.note
      if lo is not None and (v <= lo if self.lo_open else v < lo):
        return f'must be {">" if self.lo_open else ">="} {lo}' + self.note
      if hi is not None and (v >= hi if self.hi_open else v > hi):
        return f'must be {"<" if self.hi_open else "<="} {hi}' + self.note
      return None
    ok = is_number(v) and (not self.finite or math.isfinite(v))
    ok = ok and not (lo is not None and (v <= lo if self.lo_open else v < lo))
    ok = ok and not (hi is not None and (v >= hi if self.hi_open else v > hi))
    if ok:
      return None
    if self.bound:
      return (f'must be a {"finite " if self.finite else ""}number {">" if self.lo_open else ">="} {lo}'
              + self.note)
    return f'must be a number in {_interval(lo, hi, self.lo_open, self.hi_open)}' + self.note

  def describe(self):
    what = 'integer' if self.integer else 'number'
    if self.lo is None and self.hi is None:
      return what
    return f'{what} in {_interval(self.lo, self.hi, self.lo_open, self.hi_open)}'


def Num(default, lo=None, hi=None, lo_open=False, hi_open=False, note='') -> Number:  # noqa: N802
  """A finite number of a config section (one message per check: type, finiteness, each bound)."""
  return Number(default, lo=lo, hi=hi, lo_open=lo_open, hi_open=hi_open, note=note, steps=True)


def Int(default, lo=None, hi=None, note='') -> Number:  # noqa: N802
  """An integer of a config section (one message per check: type, each bound)."""
  return Number(default, lo=lo, hi=hi, integer=True, note=note, steps=True)


@dataclasses.dataclass(frozen=True)
class Integer(Rule):
  lo: int = 0
  note: str = ''

  def why_not(self, v):
    if is_number(v, integer=True) and v >= self.lo:
      return None
    return f'must be an integer >= {self.lo}' + self.note

  def describe(self):
    return f'integer >= {self.lo}'


@dataclasses.dataclass(frozen=True)
class Flag(Rule):
  message: str = 'must be True or False'

  def why_not(self, v):
    return None if isinstance(v, bool) else self.message

  def describe(self):
    return 'True | False'


@dataclasses.dataclass(frozen=True)
class Choice(Rule):
  allowed: Union[Tuple[Any, ...], Callable[[], Sequence[Any]]] = ()
  note: str = ''
  sort: bool = False            # list the allowed values sorted in the message

  def values(self) -> List[Any]:
    allowed = list(self.allowed() if callable(self.allowed) else self.allowed)
    return sorted(allowed) if self.sort else allowed

  def why_not(self, v):
    allowed = self.values()
    return None if v in allowed else f'allowed values: {allowed}' + self.note

  def describe(self):
    if callable(self.allowed):
      return 'a registered name'
    return ' | '.join(repr(a) for a in self.allowed)


@dataclasses.dataclass(frozen=True)
class String(Rule):
  message: str = 'must be a string'

  def why_not(self, v):
    return None if isinstance(v, str) else self.message

  def describe(self):
    return 'string'


@dataclasses.dataclass(frozen=True)
class Pair(Rule):
  """Two numbers (integers: `integer`), each > 0 (>= 0 when not `lo_open`); () too when `allow_empty`."""
  integer: bool = True
  allow_empty: bool = False
  lo_open: bool = True
  message: str = ''

  def why_not(self, v):
    ok = isinstance(v, (tuple, list)) and (len(v) == 2 or (self.allow_empty and len(v) == 0)) and all(
        is_number(e, self.integer) and math.isfinite(e) and (e > 0 if self.lo_open else e >= 0) for e in v)
    return None if ok else self.message

  def describe(self):
    return f'({"integer" if self.integer else "number"}, {"integer" if self.integer else "number"})'


@dataclasses.dataclass(frozen=True)
class Test(Rule):
  """A value `ok(v)` accepts (else `message`), or `why(v)` -> None | reason: what the typed rules above do not
  say (a union such as 'auto' or an int >= 1, a reason that depends on the value)."""
  ok: Optional[Callable[[Any], bool]] = None
  message: str = ''
  what: str = ''
  why: Optional[Callable[[Any], Optional[str]]] = None

  def why_not(self, v):
    if self.why is not None:
      return self.why(v)
    return None if self.ok(v) else self.message

  def describe(self):
    return self.what


@dataclasses.dataclass(frozen=True)
class DataValue(Rule):
  """A `config.data` builder argument (config/data_fields.py): kind 'int' | 'number' | 'bool' | 'str' | 'shape'
  (a tuple of positive integers) | 'sizes' (an int, or a list of per-client ints); bounds None = unbounded;
  hi = inf: infinity allowed (it means something: `what` says what). Every message ends with ' (what)'."""
  kind: str = 'number'
  lo: Optional[float] = None
  lo_open: bool = False
  hi: Optional[float] = None
  hi_open: bool = False
  what: str = ''

  def why_not(self, v):
    kind, lo, hi, what = self.kind, self.lo, self.hi, self.what
    if kind == 'bool':
      return None if isinstance(v, bool) else f'must be True or False ({what})'
    if kind == 'str':
      return None if isinstance(v, str) else f'must be a string ({what})'
    if kind == 'shape':
      ok = isinstance(v, (tuple, list)) and v and all(is_number(d, integer=True) and d >= 1 for d in v)
      return None if ok else f'must be a tuple of positive integers ({what})'
    if kind == 'sizes' and isinstance(v, (tuple, list)):
      ok = v and all(is_number(d, integer=True) and d >= 0 for d in v)
      return None if ok else f'must be an integer >= 1 or a list of per-client integers >= 0 ({what})'
    integer = kind in ('int', 'sizes')
    if (integer and not is_number(v, integer=True)) or isinstance(v, bool) or not isinstance(v, numbers.Real):
      return f'must be {"an integer" if integer else "a number"} ({what})'
    if math.isnan(v) or (math.isinf(v) and hi != math.inf):
      return f'must be finite ({what})'
    if lo is not None and (v <= lo if self.lo_open else v < lo):
      return f'must be {">" if self.lo_open else ">="} {lo} ({what})'
    if hi is not None and hi != math.inf and (v >= hi if self.hi_open else v > hi):
      return f'must be {"<" if self.hi_open else "<="} {hi} ({what})'
    return None

  def describe(self):
    if self.kind in ('bool', 'str', 'shape', 'sizes'):
      return {'bool': 'True | False', 'str': 'string', 'shape': 'tuple of integers >= 1',
              'sizes': 'integer | list of integers'}[self.kind]
    what = 'integer' if self.kind == 'int' else 'number'
    if self.lo is None and self.hi is None:
      return what
    return f'{what} in {_interval(self.lo, self.hi, self.lo_open, self.hi_open)}'


def Population() -> Integer:  # noqa: N802  (reads as a rule type at the declaration)
  """algo.population: N for |C|/N and 1/N factors; 0 = the dataset's number of clients."""
  return Integer(0, lo=0, note=" (0 = the dataset's number of clients)")


def defaults(rules: Mapping[str, Rule]) -> Dict[str, Any]:
  return {k: r.default for k, r in rules.items()}


def check(rules: Mapping[str, Rule], hp: Mapping[str, Any]) -> None:
  """Every declared hyperparameter of `hp` (defaults filled in) against its rule, in declaration order."""
  for name, rule in rules.items():
    why = rule.why_not(hp[name])
    if why:
      raise ConfigError(f'algo.{name}', hp[name], why)


# ---- fields and sections

def refuse_inert(path: str, value, default, needs: str) -> None:
  """A field set away from its default while its feature is off would be silently ignored: one ConfigError line
  naming what turns the feature on (`needs`) and the default to leave it at."""
  same = value == default or (is_number(value) and is_number(default) and float(value) == float(default))
  if not same:
    raise ConfigError(path, value, f'is read only with {needs}, which this config does not set: set that too, or '
                      f'leave {path} at its default {default!r}')



@dataclasses.dataclass(frozen=True)
class Field:
  """One config field: its name, its rule (which carries the default), a one-line doc, its tags.

  `ref`: the default is an ml_collections FieldReference of type object (a field that may hold 'auto' or a bool
  / an int). `rule=None`: a field without a value rule (a section declared elsewhere, e.g. `published`).
  `when`: the field is checked only when `when(config)` holds (a rule that only applies in one mode);
  `needs`: with `when`, what turns the field's feature on (e.g. "client.optimizer='looksam'"): the field is read
  only then, so a value away from its default while `when` does not hold is refused (`refuse_inert`), as
  config.algo refuses a hyperparameter the algorithm does not have;
  `after(config)`: a cross-field rule of its section run right after this field's (its message comes first)."""
  name: str
  rule: Optional[Rule]
  doc: str = ''
  tags: frozenset = frozenset()
  ref: bool = False
  when: Optional[Callable[[Any], bool]] = None
  after: Optional[Callable[[Any], None]] = None
  default: Any = dataclasses.field(default=None, compare=False)
  needs: str = ''

  def __post_init__(self):
    object.__setattr__(self, 'tags', frozenset(self.tags))
    unknown = self.tags - set(TAGS)
    if unknown:
      raise ValueError(f'field {self.name!r}: unknown tags {sorted(unknown)}; allowed: {TAGS}')

  def value(self):
    """The default value the config holds (a fresh copy of a mutable default)."""
    if self.rule is None:
      d = self.default() if callable(self.default) else self.default
      return d if isinstance(d, ml_collections.ConfigDict) else ml_collections.ConfigDict(d or {})
    v = self.rule.default
    return ml_collections.FieldReference(v, field_type=object) if self.ref else v


@dataclasses.dataclass(frozen=True)
class Section:
  """A config section: its fields in config order, its own tags (the section as a whole) and an optional
  cross-field check `check(cfg)` run after its fields' rules. name '' = the config's top level."""
  name: str
  fields: Tuple[Field, ...]
  check: Optional[Callable[[Any], None]] = None
  tags: frozenset = frozenset()
  doc: str = ''
  optional: bool = False          # validated only when the config has it (configs may drop the section)

  def __post_init__(self):
    object.__setattr__(self, 'fields', tuple(self.fields))
    object.__setattr__(self, 'tags', frozenset(self.tags))
    names = [f.name for f in self.fields]
    if len(set(names)) != len(names):
      raise ValueError(f'section {self.name!r} declares a field twice: {names}')

  def path(self, field: Field) -> str:
    return f'{self.name}.{field.name}' if self.name else field.name

  def field(self, name: str) -> Field:
    for f in self.fields:
      if f.name == name:
        return f
    raise KeyError(name)

  def build(self) -> ml_collections.ConfigDict:
    """The section's ConfigDict with every field's default, in declaration order."""
    c = ml_collections.ConfigDict()
    for f in self.fields:
      c[f.name] = f.value()
    return c

  def defaults(self) -> Dict[str, Any]:
    return {f.name: f.rule.default for f in self.fields if f.rule is not None}

  def validate(self, cfg) -> None:
    """Every field's rule (a field absent from the config is skipped: configs written before it existed),
    then the section's cross-field check. Raises ConfigError('<section>.<field>', value, why)."""
    node = cfg
    for part in self.name.split('.') if self.name else ():
      node = node.get(part) if hasattr(node, 'get') else None
      if node is None:
        return
    for f in self.fields:
      if f.rule is None or f.name not in node:
        continue
      if f.when is not None and not f.when(cfg):
        if f.needs:
          refuse_inert(self.path(f), node[f.name], f.rule.default, f.needs)
        continue
      v = node[f.name]
      why = f.rule.why_not(v)
      if why:
        raise ConfigError(self.path(f), v, why)
      if f.after is not None:
        f.after(cfg)
    if self.check is not None:
      self.check(cfg)


def tagged(sections: Iterable[Section], tag: str, top: bool = False) -> Tuple[str, ...]:
  """The dotted paths carrying `tag`, in declaration order: a tagged section by its name, a tagged field by
  '<section>.<field>'. top=True: the top-level names that hold them (a section once, however many of its
  fields carry the tag)."""
  out: List[str] = []
  for s in sections:
    if tag in s.tags:
      paths = [s.name]
    else:
      paths = [s.path(f) for f in s.fields if tag in f.tags]
    for p in paths:
      p = p.split('.')[0] if top else p
      if p not in out:
        out.append(p)
  return tuple(out)
