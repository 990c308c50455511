"""Names of the training splits every layer agrees on (the DAG's plan, the stages, the trainer)."""

CLEAN_SPLIT = "train"  # the corpus' training split, which every model without copies trains on
AUGMENTED_SPLIT = (
    "train_aug"  # the clean split and its copies (pipeline/augment.py): what a model with copies trains on
)
