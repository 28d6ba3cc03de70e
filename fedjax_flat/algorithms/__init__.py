"""Federated algorithms (layer 4: above core, below evaluation): each is a bundle of pure functions, the
contract of core/contract.py, built by its own module from a BuildContext and registered there with its
declarations (hyperparameter rules, allowed client optimizers, needs). registry.py builds the one a config
names; wrappers/ adds server-side averaging (SWA, WiMA) and local normalization; compose.py changes what
clients upload. A new algorithm is one module here and its test.
"""
