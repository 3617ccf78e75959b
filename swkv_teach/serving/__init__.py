"""Serving: continuous batching on one block pool (:mod:`~swkv_teach.serving.scheduler`), the varlen
forward it runs (:mod:`~swkv_teach.serving.forward`) and the workloads the bench and lessons serve
(:mod:`~swkv_teach.serving.workload`)."""

from swkv_teach.serving.forward import step_varlen
from swkv_teach.serving.scheduler import Request, Scheduler, ServingBlocks, serve
from swkv_teach.serving.workload import SYSTEM_PROMPT, chat_lines, serve_chat

__all__ = ["Request", "SYSTEM_PROMPT", "Scheduler", "ServingBlocks", "chat_lines", "serve", "serve_chat",
           "step_varlen"]
