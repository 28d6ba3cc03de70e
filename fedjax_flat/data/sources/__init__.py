"""The datasets, one module each, registered with their config fields, limits and task; readers of the
official file formats (LEAF JSON, TFF / FedJAX SQLite, CIFAR pickles read with a restricted unpickler,
CIFAR-C and PFLlib .npy / .npz, Cityscapes / GTA5 / IDDA trees, MSLS, WILDS Camelyon17, Landmarks shards)
and the synthetic stand-ins that run here.
"""
