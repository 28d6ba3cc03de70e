"""Running (layer 7): a run is a plan (plan.py: what it is, decided once from the config), a round driver
(driver.py: host-built rounds or blocks of rounds on the device) and a recorder (recorder.py: records, progress,
evaluation plug-ins in evals/, checkpoints, summary) around its state (loop.py); the FedSeq chain plan and driver
(chain_loop.py); many runs in one program (batched.py); checkpoints and bit-exact resume, the records it writes
(writers.py), the binaries' shared entry (run.py, cli.py) and the library's front door `fedjax_flat.train` (api.py).
"""
