"""Running (layer 7): the trainer that builds a run from its config and drives its rounds (loop.py; the
FedSeq chain trainer chain_loop.py; many runs in one program, batched.py), checkpoints and bit-exact resume,
the records it writes (writers.py), the binaries' shared entry (run.py, cli.py) and the library's front door
`fedjax_flat.train` (api.py).
"""
