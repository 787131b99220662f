"""wim: "What Is Missing" preference data and DPO training.

The core library: configs, prompts, backends, judges (prompts and parsing), embedders, scoring,
pairs and metrics. Pipeline stages live in `data_gen`, training and reports in `training`.
"""

__version__ = "0.1.0"
