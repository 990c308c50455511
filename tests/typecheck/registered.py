"""Every registered model's task, evaluation and server and every strategy, assigned to a variable of
its models/interfaces.py protocol: mypy (`make typecheck`; tests/test_protocols.py runs it) fails
here when one no longer implements its protocol (a method's parameters, a return type, a missing
member), and names the member.

Type-checked, never run. tests/test_protocols.py fails when an entry of common/catalog.py's
registries (the test extensions' included) has no line here: a new model or strategy adds its
lines beside the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from models.asr.evaluation import evaluate as asr_evaluate
from models.asr.server import AsrServer
from models.asr.task import AsrTask
from models.distributed.gossip import GossipStrategy
from models.distributed.strategies import Allreduce
from models.interfaces import Evaluation, FusedStrategy, Server, Strategy, Task
from models.tts.evaluation import evaluate as tts_evaluate
from models.tts.server import TtsServer
from models.tts.task import TtsTask
from tests.extension.local_sgd import LocalSgd
from tests.extension.speaker_id import SpeakerIdServer, SpeakerIdTask
from tests.extension.speaker_id import evaluate as speaker_id_evaluate

T = TypeVar("T")


# An instance of each class, as mypy sees it: an instance assigned to a protocol gets an error that
# names the member at fault (a class assigned to `type[...]` gets none). A task is made by its
# `create`, a member of `Task`. Servers and strategies are made by calling the class, and mypy
# leaves a protocol's `__init__` out of the comparison: their helpers take the class as a callable
# of the constructor's arguments, so a constructor that drifts fails at the call.
def instance(cls: type[T]) -> T:
    raise TypeError("type-checked, never run")


def server_instance(cls: Callable[[Any, Any, dict], T]) -> T:  # Server.__init__(model, config, data)
    raise TypeError("type-checked, never run")


def strategy_instance(cls: Callable[[Any, list, Any], T]) -> T:  # Strategy.__init__(config, model_vars, optimizer)
    raise TypeError("type-checked, never run")


# model "asr"
asr_task: Task = instance(AsrTask)
asr_evaluation: Evaluation = asr_evaluate
asr_server: Server = server_instance(AsrServer)

# model "tts"
tts_task: Task = instance(TtsTask)
tts_evaluation: Evaluation = tts_evaluate
tts_server: Server = server_instance(TtsServer)

# model "speaker_id" (tests/extension)
speaker_id_task: Task = instance(SpeakerIdTask)
speaker_id_evaluation: Evaluation = speaker_id_evaluate
speaker_id_server: Server = server_instance(SpeakerIdServer)

# strategies "allreduce", "adpsgd", "local_sgd" (tests/extension)
allreduce_strategy: Strategy = strategy_instance(Allreduce)
allreduce_fuses: FusedStrategy = strategy_instance(Allreduce)  # its fused_step may be True
adpsgd_strategy: Strategy = strategy_instance(GossipStrategy)
local_sgd_strategy: Strategy = strategy_instance(LocalSgd)
