"""Training and evaluation input transforms, jit-traceable and random per example: augmentation (augment.py),
normalization (pipeline.py), the per-client transform contract (transform.py) and the style transfer of
FedDrive / LADD (style_transfer.py: CFSI, LAB; fda.py: FDA styles).
"""
