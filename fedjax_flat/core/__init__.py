"""The round engine (layer 3): one compiled program per round or block of rounds. engine.py runs the sampled
clients (vmap, chunks or a sequence) and the server update of an algorithm's contract (contract.py);
rounds.py puts sampling and batching on the device, runs.py vmaps whole runs, sharding.py spreads clients
over devices and hosts, client_state.py keeps per-client state, chains.py runs FedSeq's chains.
"""
