"""Client grouping into superclients (FedSeq, thesis 5.2.2), usable by any algorithm.

  estimators.py    psi: classifier weights + PCA, confidence vectors (eq. 5.1), Task2Vec diagonal Fisher
  distances.py     tau: euclidean, cosine, normalized cosine, KL-style and Gini diversity (reference code)
  groupers.py      phi: random, k-means + round-robin, greedy farthest-from-mean, ICG; constraints
  pretrain.py      the pre-training / fine-tuning / Fisher passes on the round engine, and their cache
  stats.py         sizes, classes and label entropy per superclient
  superclients.py  build_superclients(config, ctx, workdir, num_superclients=None): the entry point
"""
