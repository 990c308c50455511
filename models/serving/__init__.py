"""Serving a trained model, generic over models: the MLflow pyfunc model and its logging
(pyfunc.py). What it builds on lives below it, so the model packages, training and evaluation never
import serving: the operator's limits and a request's rows read and checked
(models/request_policy.py, re-exported here), opening a trained model (models/opening.py) and each
model's server in its own package (common/catalog.py `ModelEntry.server`: models/asr/server.py,
models/tts/server.py). policy.py and opening.py here are the former names, kept for one release.

MLflow pickles the pyfunc class by its import path: registered models name it
`models.serving.pyfunc.SpeechModel`, those registered before it moved there `models.serving.SpeechModel`,
so it is importable here too.
"""

from models.request_policy import RequestError, ServingConfig  # noqa: F401
from models.serving.pyfunc import SpeechModel, log_model  # noqa: F401
