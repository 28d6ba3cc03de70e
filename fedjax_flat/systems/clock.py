"""A virtual clock of heterogeneous devices (`config.system`), as pure numpy functions of (config, round, clients).

Each client k has a compute speed v_k (examples/s; drawn ONCE from (seed, k): log-normal v_k = median exp(sigma
z_k), or read from a trace file), download / upload bandwidths (Mbps) and an availability. In round r a sampled
client k that is available downloads the model, runs its local steps and uploads:

    down_k    = bytes_down * 8 / (down_mbps_k 1e6)           up_k = bytes_up * 8 / (up_mbps_k 1e6)
    step j    = examples_j * passes / v_k                      passes: forward+backward passes of one local step:
                                                              the client optimizer's (SGD 1, SAM / ASAM 2: so
                                                              FedSAM, FedGloSS, FedSMOO, FedSpeed 2; MAN's term
                                                              rides the same pass) x the algorithm's phases
                                                              (NaiveFedGloSS, FedRep) + its extra_passes (Mime:
                                                              the gradient at the server model)
    deadline D > 0: fit_k = the most leading steps with down_k + sum_{j < fit_k} step j + up_k <= D;
                    fewer than min_steps (and not all its work): the client is dropped (weight 0, no upload)
    dropout p: with probability p (per (seed, round, client)) the client drops mid-round, its upload discarded

and the round lasts as long as the slowest *reporting* client's down + compute + up; with a deadline, D itself
when an available client did not report (the server waited for it). Nobody reporting without a deadline: 0 s.
Bytes down count every available sampled client, bytes up every reporting one.

Availability of (seed, round, client): 'always'; 'bernoulli' (each round with probability `availability_rate`);
'diurnal' (client k's time zone offset o_k drawn once from (seed, k), uniform in [0, 24) h; available while its
local hour (r round_duration_s / 3600 + o_k) mod 24 lies in [window_start_h, window_start_h + window_h)); 'trace'
(the trace's per-client `available_hours` on the same nominal clock). The nominal round spacing
`round_duration_s` (not the simulated durations) drives the hours, so that availability stays a pure function of
(seed, round, client) and a resumed run, a block of rounds and the host all agree; with these two availabilities
a round lasts at least round_duration_s (the server starts one round per slot), so the virtual time and the hours
agree unless a round overruns its slot.
A sampled client that is unavailable does not respond: weight 0, nothing sent.

Trace file (`system.trace`), CSV with a header or JSON; every client of the population once, ids 0 .. K-1:

    client,examples_per_s,up_mbps,down_mbps,available_hours        (the last column optional: '0-6 22-24')
    {"0": {"examples_per_s": 120, "up_mbps": 2, "down_mbps": 20, "available_hours": [[0, 6], [22, 24]]}, ...}

`up_mbps` / `down_mbps` columns may be left out (JSON: keys), then system.up_mbps / down_mbps apply. A trace is
UTF-8, at most MAX_TRACE_BYTES (64 MiB) and MAX_TRACE_CLIENTS (10^6) rows; it is read row by row, and once the
population is known a row naming a client outside it stops the read (one error line).
"""
from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
from typing import Optional, Sequence

import numpy as np

from fedjax_flat.errors import ConfigError
from fedjax_flat.schema import INPUT, RESULT, Choice, Field, Int, Num, Section, String

SPEEDS = ('none', 'lognormal', 'trace')
AVAILABILITY = ('always', 'bernoulli', 'diurnal', 'trace')
# log-std bound of the log-normal speeds: e^(10 z) for |z| <= 8.5 (10^16 clients) stays within float64; at 1000
# a few clients' speeds are inf or 0 and the virtual time overflows (metrics.jsonl had Infinity).
MAX_SPEED_SIGMA = 10.0
BYTES_PER_PARAM = 4           # float32 messages (today's comm_bytes: 4 x params)
# The one definition of a run's bytes sent (metrics.jsonl `comm_bytes`, summary.json `comm_total_bytes`, the
# clock's `bytes_down` + `bytes_up`, summary.md's "bytes sent"): model messages (float32, or a compressed upload's
# real bytes) downloaded by the sampled clients that were online + uploaded by those whose upload reached the
# server. Without the clock every sampled client is online and reports; with it an unavailable client downloads
# nothing and one that drops out or misses the deadline uploads nothing (asynchronous algorithms: every dispatch
# downloads, the arrivals within max_staleness upload).
COMM_BYTES = 'downloads to the sampled clients that were online + uploads that reached the server'
# Stream tags of the draws (numpy Generators seeded [seed, (round,) client, tag]).
SPEED_STREAM, OFFSET_STREAM, AVAIL_STREAM, DROP_STREAM = 0x5BEED, 0x702E, 0xA7A1, 0xD209


def enabled(cfg) -> bool:
  """Whether the run has a clock: any system field away from its 'none' default (a config or its dict)."""
  s = cfg.get('system')
  return s is not None and (s['speed'] != 'none' or s['availability'] != 'always' or float(s['dropout']) > 0
                            or float(s['deadline_s']) > 0)


def _sigma(cfg) -> None:
  v = float(cfg.system.speed_sigma)
  if v > MAX_SPEED_SIGMA:
    raise ConfigError('system.speed_sigma', cfg.system.speed_sigma, f'must be <= {MAX_SPEED_SIGMA:g}: a client z '
                      f'standard deviations off runs e^({v:g} z) times the median speed, which overflows (inf / 0 '
                      f'examples/s, an infinite virtual time); use 0 .. {MAX_SPEED_SIGMA:g}')


def switched_on(cfg):
  """(field, value) of the first system field that gives the run its clock (what the user set), e.g.
  ('system.speed', 'lognormal')."""
  s = cfg.system
  for name, off in (('speed', 'none'), ('availability', 'always'), ('deadline_s', 0.0), ('dropout', 0.0)):
    if s[name] != off:
      return f'system.{name}', s[name]
  return 'system.speed', s.speed


def _check(cfg) -> None:
  """The system section's own cross-field rules, before any data are read (the population's: `build`)."""
  s = cfg.system
  if float(s.deadline_s) > 0 and s.speed == 'none':
    raise ConfigError('system.deadline_s', s.deadline_s, "needs client speeds: set system.speed='lognormal' "
                      "or 'trace'")
  uses_trace = s.speed == 'trace' or s.availability == 'trace'
  if uses_trace and not s.trace:
    raise ConfigError('system.trace', s.trace, "a CSV / JSON trace file is needed by system.speed='trace' or "
                      "system.availability='trace' (format: fedjax_flat/systems/clock.py)")
  if uses_trace:
    read_trace(s.trace)       # malformed: one line naming the file and the row
  elif s.trace:
    raise ConfigError('system.trace', s.trace, "is read only with system.speed='trace' or "
                      "system.availability='trace'; set one or leave the trace empty")


# The numbers (tagged INPUT) are per-run inputs of a batched program (core/runs.py): each lane's step limits come
# from its own schedule on the host; the kinds and the trace file are structure (runs with other kinds split packs).
_IN = frozenset({INPUT})
_LOGNORMAL_ON = "system.speed='lognormal'"
_CLOCK_ON = "a virtual clock (system.speed, availability, dropout or deadline_s)"


def _lognormal(cfg) -> bool:
  return cfg.system.speed == 'lognormal'


def _avail(*kinds):
  return lambda cfg: cfg.system.availability in kinds

SECTION = Section('system', (
    Field('speed', Choice('none', SPEEDS), "clients' compute speed (examples/s): 'none' (instant, as without a "
          "clock) | 'lognormal' (median speed_median, log-std speed_sigma, per (seed, client)) | 'trace'"),
    Field('speed_median', Num(100.0, lo=0, lo_open=True), "median examples/s of the log-normal speeds", _IN,
          when=_lognormal, needs=_LOGNORMAL_ON),
    Field('speed_sigma', Num(0.5, lo=0), 'log-std of the log-normal speeds (0: every client at the median; at most '
          f'{MAX_SPEED_SIGMA:g})', _IN, after=_sigma, when=_lognormal, needs=_LOGNORMAL_ON),
    Field('trace', String(''), 'CSV / JSON trace of client speeds, bandwidths and available hours (format: '
          'systems/clock.py)'),
    Field('deadline_s', Num(0.0, lo=0), '> 0: a round closes after this many virtual seconds; each client runs '
          'the local steps that fit (0: none)', _IN),
    Field('min_steps', Int(1, lo=0), 'under a deadline, a client fitting fewer steps (and not all its work) is '
          'dropped', _IN, when=lambda cfg: float(cfg.system.deadline_s) > 0, needs='system.deadline_s > 0'),
    Field('availability', Choice('always', AVAILABILITY), "'always' | 'bernoulli' (availability_rate a round) | "
          "'diurnal' (a time-zone offset per client, available in a daily window) | 'trace'"),
    Field('availability_rate', Num(1.0, lo=0, hi=1), "'bernoulli': probability a client is available a round",
          _IN, when=_avail('bernoulli'), needs="system.availability='bernoulli'"),
    Field('window_start_h', Num(0.0, lo=0, hi=24, hi_open=True), "'diurnal': local hour the window opens", _IN,
          when=_avail('diurnal'), needs="system.availability='diurnal'"),
    Field('window_h', Num(8.0, lo=0, hi=24, lo_open=True), "'diurnal': hours the window stays open", _IN,
          when=_avail('diurnal'), needs="system.availability='diurnal'"),
    Field('round_duration_s', Num(3600.0, lo=0, lo_open=True), "nominal spacing of round starts for the hours "
          "of 'diurnal' / 'trace' availability", _IN, when=_avail('diurnal', 'trace'),
          needs="system.availability='diurnal' or 'trace'"),
    Field('dropout', Num(0.0, lo=0, hi=1, hi_open=True), 'probability an available client drops mid-round (its '
          'upload discarded)', _IN),
    Field('up_mbps', Num(1.0, lo=0, lo_open=True), 'upload bandwidth, Mbps (a trace may set it per client)', _IN,
          when=enabled, needs=_CLOCK_ON),
    Field('down_mbps', Num(10.0, lo=0, lo_open=True), 'download bandwidth, Mbps (a trace may set it per client)',
          _IN, when=enabled, needs=_CLOCK_ON),
), check=_check, tags={RESULT}, doc='a virtual clock of heterogeneous devices (systems/clock.py)')


# ---- the trace file

def _hours(text, where: str):
  """'0-6 22-24' or [[0, 6], [22, 24]] -> ((0.0, 6.0), (22.0, 24.0))."""
  if isinstance(text, str):
    parts = [p.split('-') for p in text.split()]
  elif isinstance(text, (list, tuple)) or text is None:
    parts = list(text or ())
  else:
    parts = [None]          # a number, an object: refused below
  out = []
  for p in parts:
    try:
      a, b = float(p[0]), float(p[1])
    except (TypeError, ValueError, IndexError):
      raise ConfigError('system.trace', where, f'available_hours {str(text)[:60]!r}: ranges like "0-6 22-24" '
                        '(JSON: [[0, 6], [22, 24]])') from None
    if not (len(p) == 2 and 0 <= a < b <= 24):
      raise ConfigError('system.trace', where, f'available_hours range {str(p)[:60]}: needs 0 <= start < end <= 24')
    out.append((a, b))
  return tuple(out)


# A trace holds one row per client of the population, read row by row (CSV streamed; JSON parsed whole) and
# bounded: at most MAX_TRACE_BYTES on disk (a 10^6-client CSV with every column is ~40 MB) and MAX_TRACE_CLIENTS
# rows, ids below it. A larger file is refused in one line before it is read.
MAX_TRACE_CLIENTS = 1_000_000
MAX_TRACE_BYTES = 64 << 20


def _trace_items(path: str):
  """(client key, row dict, where) of each row of a trace, streamed (CSV) or from the parsed JSON object; a file
  that cannot be read, is not UTF-8, is nested too deep or is too large is one ConfigError line."""
  if not os.path.isfile(path):
    raise ConfigError('system.trace', path, 'no such file')
  try:
    size = os.path.getsize(path)
    if size > MAX_TRACE_BYTES:
      raise ConfigError('system.trace', path, f'is {size / 2**20:.0f} MiB, over the {MAX_TRACE_BYTES >> 20} MiB a '
                        f'trace may hold (one row per client of the population, at most {MAX_TRACE_CLIENTS}); '
                        "keep only the population's rows")
    if path.endswith('.json'):
      with open(path, encoding='utf-8') as f:
        raw = json.load(f, parse_int=float)     # a 5,000-digit number is a (too large) float, not int's error
      if not isinstance(raw, dict):
        raise ConfigError('system.trace', path, 'must map client ids to {"examples_per_s": ..., ...}')
      if len(raw) > MAX_TRACE_CLIENTS:
        raise ConfigError('system.trace', path, f'names {len(raw)} clients: a trace holds one row per client of '
                          f'the population, at most {MAX_TRACE_CLIENTS}')
      for k, v in raw.items():
        yield k, v, f'{path}: client {k[:20]!r}'
      return
    with open(path, encoding='utf-8', newline='') as f:
      reader = csv.DictReader(f)
      if not reader.fieldnames or not {'client', 'examples_per_s'} <= set(reader.fieldnames):
        raise ConfigError('system.trace', path, 'needs a header with client,examples_per_s[,up_mbps,down_mbps,'
                          'available_hours]')
      for i, r in enumerate(reader):
        if i >= MAX_TRACE_CLIENTS:
          raise ConfigError('system.trace', f'{path}:{i + 2}', f'more than {MAX_TRACE_CLIENTS} rows: a trace holds '
                            'one row per client of the population')
        yield r['client'], r, f'{path}:{i + 2}'
  except ConfigError:
    raise
  except UnicodeDecodeError as e:
    raise ConfigError('system.trace', path, f'is not UTF-8 text (byte 0x{e.object[e.start]:02x} cannot be '
                      'decoded); write the trace as UTF-8 CSV or JSON') from None
  except json.JSONDecodeError as e:
    raise ConfigError('system.trace', path, f'is not JSON ({e.msg} at line {e.lineno})') from None
  except RecursionError:
    raise ConfigError('system.trace', path, 'is not a trace: its JSON is nested too deep (a trace maps client '
                      'ids to flat objects)') from None
  except (csv.Error, ValueError) as e:      # a NUL byte, a field over csv's size limit, ...
    raise ConfigError('system.trace', path, f'is not a CSV / JSON trace ({type(e).__name__}: '
                      f'{" ".join(str(e).split())[:120]})') from None
  except OSError as e:
    raise ConfigError('system.trace', path, f'cannot be read ({e.strerror or e}); check the path and its '
                      'permissions') from None


def read_trace(path: str, population: Optional[int] = None) -> dict:
  """{client: {'examples_per_s', 'up_mbps' (or None), 'down_mbps' (or None), 'available_hours'}} of a trace.

  Streamed: the rows are checked one at a time; with `population`, a row naming a client outside it stops the
  read at once (one ConfigError line), so only the population's rows are ever held. Without it (validation,
  before the data are read), the rows are checked and only their ids kept (ids below MAX_TRACE_CLIENTS)."""
  keep = population is not None
  bound = population if keep else MAX_TRACE_CLIENTS
  seen = bytearray(bound)
  rows = {}
  count = 0
  for k, v, where in _trace_items(path):
    if not isinstance(v, dict):
      raise ConfigError('system.trace', where, 'must be an object with examples_per_s')
    try:
      if not isinstance(k, str) or len(k.strip()) > 20:
        raise ValueError(k)
      client = int(k)
      speed = float(v['examples_per_s'])
      up = float(v['up_mbps']) if v.get('up_mbps') not in (None, '') else None
      down = float(v['down_mbps']) if v.get('down_mbps') not in (None, '') else None
    except (KeyError, TypeError, ValueError):
      raise ConfigError('system.trace', where, 'needs an integer client and numbers examples_per_s / up_mbps / '
                        'down_mbps') from None
    if client < 0 or (client < bound and seen[client]):
      raise ConfigError('system.trace', where, f'client {client}: ids are 0 .. K-1, each once')
    if client >= bound:
      if keep:
        raise ConfigError('system.trace', path, f'names client {client} beyond the population of {population} '
                          f'(ids 0 .. {population - 1})')
      raise ConfigError('system.trace', where, f'client {client}: ids are 0 .. K-1 for a population of K, at '
                        f'most {MAX_TRACE_CLIENTS}')
    seen[client] = 1
    count += 1
    for name, x in (('examples_per_s', speed), ('up_mbps', up), ('down_mbps', down)):
      if x is not None and not (math.isfinite(x) and x > 0):
        raise ConfigError('system.trace', where, f'{name}={x}: must be a positive number')
    hours = _hours(v.get('available_hours'), where)
    if keep:
      rows[client] = {'examples_per_s': speed, 'up_mbps': up, 'down_mbps': down, 'available_hours': hours}
  if not count:
    raise ConfigError('system.trace', path, 'names no client')
  return rows


# ---- per-client constants (drawn once)

def _uniform(seed: int, ids, *tags) -> np.ndarray:
  return np.array([np.random.default_rng([int(seed), *[int(t) for t in tags], int(k)]).random() for k in ids])


def _normal(seed: int, ids, tag) -> np.ndarray:
  return np.array([np.random.default_rng([int(seed), int(tag), int(k)]).standard_normal() for k in ids])


@dataclasses.dataclass(frozen=True)
class Devices:
  """The population's per-client constants: speeds (examples/s; inf: instant), bandwidths, time-zone offsets,
  available hours (trace)."""
  speed: np.ndarray          # [K]
  up_mbps: np.ndarray        # [K]
  down_mbps: np.ndarray      # [K]
  offset_h: np.ndarray       # [K]  diurnal time-zone offsets
  hours: tuple               # K tuples of (start, end) hours (trace availability), or ()


def devices(cfg, population: int) -> Devices:
  """Each client's constants, from (seed, client) or the trace; bad traces and impossible deadlines are one
  ConfigError line."""
  s, seed, ids = cfg.system, int(cfg.seed), np.arange(population)
  up = np.full(population, float(s.up_mbps))
  down = np.full(population, float(s.down_mbps))
  hours = ()
  if s.speed == 'lognormal':
    speed = float(s.speed_median) * np.exp(float(s.speed_sigma) * _normal(seed, ids, SPEED_STREAM))
    bad = ~((speed > 1e-300) & (speed < 1e300))       # a step's seconds must stay finite
    if bad.any():
      raise ConfigError('system.speed_median', s.speed_median, f'with system.speed_sigma={s.speed_sigma} client '
                        f'{int(np.argmax(bad))} gets speed {float(speed[bad][0]):.3g} examples/s (the clock needs '
                        '1e-300 .. 1e300); choose a median nearer 100 or a smaller sigma')
  else:
    speed = np.full(population, np.inf)
  if s.speed == 'trace' or s.availability == 'trace':
    rows = read_trace(s.trace, population)      # stops at the first row outside the population
    missing = [k for k in range(population) if k not in rows]
    if missing:
      raise ConfigError('system.trace', s.trace, f'misses clients {missing[:5]}{" ..." if len(missing) > 5 else ""}'
                        f' of the population of {population}: every client needs a row')
    if s.speed == 'trace':
      speed = np.array([rows[k]['examples_per_s'] for k in range(population)])
      up = np.array([rows[k]['up_mbps'] or float(s.up_mbps) for k in range(population)])
      down = np.array([rows[k]['down_mbps'] or float(s.down_mbps) for k in range(population)])
    if s.availability == 'trace':
      hours = tuple(rows[k]['available_hours'] for k in range(population))
  offset = 24.0 * _uniform(seed, ids, OFFSET_STREAM) if s.availability == 'diurnal' else np.zeros(population)
  return Devices(speed, up, down, offset, hours)


def step_examples(n: int, batch_size: int, *, epochs: int = 1, local_steps: int = 0, full_batches: bool = False,
                  max_steps: int = 0) -> np.ndarray:
  """Examples of each of a client's local steps, in order (data/batching.py's layout: each epoch's batches of B,
  the last one partial unless full_batches; or local_steps full batches)."""
  if n <= 0:
    return np.zeros((0,), np.float64)
  if local_steps:
    return np.full(local_steps, float(batch_size))
  per_epoch = n // batch_size if full_batches else -(-n // batch_size)
  one = np.full(per_epoch, float(batch_size))
  if not full_batches and per_epoch:
    one[-1] = n - (per_epoch - 1) * batch_size
  out = np.tile(one, epochs)
  return out[:max_steps] if max_steps else out


# ---- the clock of one round

@dataclasses.dataclass(frozen=True)
class Clock:
  """What the round schedules are computed from: the population's devices and the run's constants."""
  devices: Devices
  passes: float               # forward+backward passes per local step
  bytes_down: float           # per client and round (all phases)
  bytes_up: float
  deadline_s: float
  min_steps: int
  availability: str
  rate: float
  window: tuple               # (start hour, length in hours)
  round_duration_s: float
  dropout: float
  seed: int


def make_clock(cfg, population: int, *, passes: float, bytes_down: float, bytes_up: float,
               full_steps: Optional[Sequence[np.ndarray]] = None) -> Clock:
  """The run's clock; `full_steps` (every client's step_examples) checks that a deadline is reachable."""
  s = cfg.system
  clock = Clock(devices(cfg, population), float(passes), float(bytes_down), float(bytes_up), float(s.deadline_s),
                int(s.min_steps), str(s.availability), float(s.availability_rate),
                (float(s.window_start_h), float(s.window_h)), float(s.round_duration_s), float(s.dropout),
                int(cfg.seed))
  if clock.deadline_s > 0 and full_steps is not None:
    fit = np.array([fit_steps(clock, k, full_steps[k]) for k in range(population)])
    need = np.array([min(max(clock.min_steps, 1), len(full_steps[k])) for k in range(population)])
    if not np.any((fit >= need) & (need > 0)):
      d = clock.devices
      best = float(np.min(transfer_s(clock, np.arange(population))))
      raise ConfigError('system.deadline_s', s.deadline_s, f'no client can meet it: the fastest transfer alone '
                        f'takes {best:.3g} s and the fastest speed is {float(np.max(d.speed)):.3g} examples/s '
                        f'({clock.passes:g} passes a step); raise the deadline or lower system.min_steps')
  return clock


def transfer_s(clock: Clock, ids) -> np.ndarray:
  """down + up seconds of the given clients."""
  d = clock.devices
  return (clock.bytes_down * 8 / (d.down_mbps[ids] * 1e6)) + (clock.bytes_up * 8 / (d.up_mbps[ids] * 1e6))


def fit_steps(clock: Clock, k: int, steps: np.ndarray) -> int:
  """The leading local steps of client k that fit the deadline (all of them without one)."""
  if clock.deadline_s <= 0:
    return len(steps)
  budget = clock.deadline_s - float(transfer_s(clock, np.array([k]))[0])
  cost = np.cumsum(steps * clock.passes / clock.devices.speed[k])
  return int(np.searchsorted(cost, budget * (1 + 1e-12), side='right'))


def available(clock: Clock, r: int, ids) -> np.ndarray:
  """bool [C]: whether each client answers round r (pure in (seed, round, client))."""
  ids = np.asarray(ids, np.int64)
  if clock.availability == 'always':
    return np.ones(len(ids), bool)
  if clock.availability == 'bernoulli':
    return _uniform(clock.seed, ids, AVAIL_STREAM, r) < clock.rate
  utc = (r * clock.round_duration_s / 3600.0) % 24.0
  if clock.availability == 'diurnal':
    start, length = clock.window
    local = (utc + clock.devices.offset_h[ids]) % 24.0
    return ((local - start) % 24.0) < length
  return np.array([any(a <= utc < b for a, b in clock.devices.hours[k]) for k in ids], bool)


@dataclasses.dataclass(frozen=True)
class RoundSchedule:
  """One round on the clock, per sampled client [C] and in total."""
  ids: np.ndarray
  available: np.ndarray
  dropped_out: np.ndarray
  fit: np.ndarray             # local steps run (int)
  reports: np.ndarray         # bool: its upload reaches the server
  down_s: np.ndarray
  compute_s: np.ndarray
  up_s: np.ndarray
  duration_s: float
  bytes_down: float
  bytes_up: float


def schedule(clock: Clock, r: int, ids, steps: Sequence[np.ndarray]) -> RoundSchedule:
  """Round r of clients `ids` (real ids), `steps[i]` the examples of client ids[i]'s local steps."""
  ids = np.asarray(ids, np.int64)
  d = clock.devices
  avail = available(clock, r, ids)
  drop = (_uniform(clock.seed, ids, DROP_STREAM, r) < clock.dropout) if clock.dropout > 0 else np.zeros(len(ids),
                                                                                                        bool)
  drop &= avail
  fit = np.array([fit_steps(clock, int(k), st) for k, st in zip(ids, steps)], np.int64)
  work = np.array([len(st) for st in steps], np.int64)
  enough = (fit >= clock.min_steps) | (fit >= work)
  fit = np.where(avail & ~drop & enough, fit, 0)
  reports = avail & ~drop & enough & (work > 0)
  down = np.where(avail, clock.bytes_down * 8 / (d.down_mbps[ids] * 1e6), 0.0)
  up = np.where(reports, clock.bytes_up * 8 / (d.up_mbps[ids] * 1e6), 0.0)
  compute = np.array([float(np.sum(st[:f])) * clock.passes / d.speed[k] if f else 0.0
                      for k, st, f in zip(ids, steps, fit)])
  total = down + compute + up
  duration = float(np.max(total[reports])) if reports.any() else 0.0
  if clock.deadline_s > 0 and np.any(avail & ~reports):
    duration = clock.deadline_s
  if clock.availability in ('diurnal', 'trace'):     # rounds start on the nominal clock the hours follow
    duration = max(duration, clock.round_duration_s)
  return RoundSchedule(ids, avail, drop, fit, reports, down, compute, up, duration,
                       float(np.sum(avail)) * clock.bytes_down, float(np.sum(reports)) * clock.bytes_up)


def padded(sched: RoundSchedule, cohort: int, num_steps: int):
  """(fit [cohort] int32, reports [cohort] bool) padded with empty clients: what the round program masks with."""
  fit = np.zeros((cohort,), np.int32)
  rep = np.zeros((cohort,), bool)
  n = len(sched.ids)
  fit[:n] = np.minimum(sched.fit, num_steps)
  rep[:n] = sched.reports
  return fit, rep
