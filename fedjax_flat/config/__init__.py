"""Configs (layer 6): the default config, its validation before anything is loaded or compiled, the paper
tables' families (families.py, paper_hparams.py, table_index.py) and `--config.algo.*` flags. A ConfigDict
goes in; a validated ConfigDict, or one ConfigError line naming the field, comes out.
"""
