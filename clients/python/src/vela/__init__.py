"""vela-client: Python client of Vela (docs/PROTOCOL.md is the contract).

- :class:`Vela`: REST (fine-tunes, sessions) and :meth:`Vela.training_session`, whose ops return futures.
- :class:`ServiceClient`: the futures API (xorl / Tinker style); its :class:`TrainingClient`'s ops return :class:`APIFuture`.
- :class:`WebsocketClientPolicy`: a drop-in for openpi_client's, for ``vela policy`` and a job's policy.
- :class:`RealTimeChunking` over an :class:`ActionQueue`: the client side of real-time chunking.
- :func:`resize_with_pad`: the server's frame resize (docs/MODEL.md D12), which the clients apply before sending.
- Errors: :class:`VelaError` and its subclasses keep the server's code and message.
"""

from .client import FineTunes, Vela
from .datasets import Datasets
from .errors import (AnswerLostError, AuthenticationError, BadRequestError, ConflictError, ConnectionClosedError, ExpiredError, InsufficientMemoryError,
                     NotFoundError, RateLimitError, ServerError, TakenOverError, TooLargeError, VelaError)
from .frames import resize_with_pad
from .futures import AdamParams, APIFuture, LoraConfig, ServiceClient, TrainingClient
from .policy import WebsocketClientPolicy, wait_policy_ready
from .rtc import ActionQueue, Capture, RealTimeChunking, Splice
from .session import RequestFuture, TrainingSession
from .wire import packb, unpackb

__all__ = [
    "Vela", "FineTunes", "Datasets", "TrainingSession", "RequestFuture", "WebsocketClientPolicy", "wait_policy_ready", "RealTimeChunking", "ActionQueue", "Capture", "Splice", "packb", "unpackb",
    "resize_with_pad",
    "ServiceClient", "TrainingClient", "APIFuture", "AdamParams", "LoraConfig",
    "VelaError", "BadRequestError", "AuthenticationError", "NotFoundError", "ConflictError", "ExpiredError", "TooLargeError",
    "InsufficientMemoryError", "RateLimitError", "ServerError", "ConnectionClosedError", "TakenOverError", "AnswerLostError",
]
__version__ = "0.1.0"
