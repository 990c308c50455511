"""Serving a trained model: every piece of it that runs in the training environment lives here.

  pyfunc.py          the MLflow pyfunc model (`SpeechModel`) and its logging
  request_policy.py  what a served model accepts: the operator's limits, a request's rows read and
                     checked, a bad row refused as an HTTP 400; the part every model's server shares
  mlflow_serve.py    `mlflow models serve` of a logged model: its command line, its environment, and a
                     process that is started, waited for and stopped (tests, benchmarks/serving.py)
  try_launcher.py    `make try`: serves the registered champions and starts the page that tries them

Why under models/: a logged model carries common/, models/ and pipeline/ as its code (pyfunc.py
`log_model`) and MLflow pickles the pyfunc class by its import path, `models.serving.pyfunc.SpeechModel`;
so the served model's code must sit inside the code it carries, at that path.

What it builds on lives below it. Each model's server is in its own package (common/catalog.py
`ModelEntry.server`: models/asr/server.py, models/tts/server.py) and imports of serving only the request
policy, which imports nothing of models/; the pyfunc model reaches a server only by its catalog name.
The model packages, training and evaluation import nothing of serving (tests/test_layering.py); a
trained model is opened by models/trained_model.py, which serving shares with them.

The try page itself (apps/try_page.py) is not here: it runs in an environment of its own (.venv-try,
Gradio without TensorFlow or MLflow) and asks the served champions over HTTP, as any client would.
"""
