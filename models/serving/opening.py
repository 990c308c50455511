"""Opening a trained model moved to models/opening.py (below the serving layer, so evaluation,
transcription and synthesis need no serving code); this name is kept for one release."""

from models.opening import FORMS, ModelSource, load_model_dir, locate, open_model  # noqa: F401
