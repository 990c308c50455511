"""What a served model accepts (the operator's limits, a request's rows read and checked) moved to
models/request_policy.py, below the serving layer, so a model's server uses it without importing
serving; this name is kept for one release."""

from models.request_policy import *  # noqa: F403
