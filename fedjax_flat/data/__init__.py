"""Federated data (layer 2): datasets as FederatedDataset (in memory) or ClientDataSource (streamed), each
registered by its module in sources/ with its config fields and task; partitions, client sampling and the
padded, masked round batches (batching.py) that keep one program per run whatever the client sizes;
transforms/ holds augmentation and style transfer, download.py the checksummed, resumable downloads.
"""
