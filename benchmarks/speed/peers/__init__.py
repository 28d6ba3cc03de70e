"""The peers: the PyTorch reference pattern and FedJAX 0.0.17, as subprocesses speaking JSON lines."""
