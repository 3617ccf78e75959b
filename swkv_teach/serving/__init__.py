"""Serving: continuous batching on one block pool (:mod:`~swkv_teach.serving.scheduler`, its per-request
state in :mod:`~swkv_teach.serving.requests`), the varlen forward it runs (:mod:`~swkv_teach.serving.forward`)
and the workload the bench and lesson 12 serve (:mod:`~swkv_teach.serving.workload`)."""

from swkv_teach.serving.forward import step_varlen
from swkv_teach.serving.requests import Request, ServingBlocks
from swkv_teach.serving.scheduler import Scheduler, serve
from swkv_teach.serving.workload import SYSTEM_PROMPT, chat_lines, serve_chat

__all__ = ["Request", "SYSTEM_PROMPT", "Scheduler", "ServingBlocks", "chat_lines", "serve", "serve_chat",
           "step_varlen"]
