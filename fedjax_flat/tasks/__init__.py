"""Tasks (layer 1): what a label means. A task gives the loss over the valid units of a masked batch and
additive evaluation metrics: classification, dense classification (tokens), segmentation (mIoU), retrieval
(Recall@K). A dataset declares its task; training, evaluation and the Hessian tools all go through it.
"""
