"""Adapters that put the guard where agent frameworks run tools; each an optional extra.

- :mod:`oncegate.integrations.openai_agents` (``pip install 'oncegate[openai-agents]'``):
  :func:`~oncegate.integrations.openai_agents.guarded_function_tool`, a ``function_tool`` whose
  calls run at most once per workflow run, read from the SDK's run context.
- :mod:`oncegate.integrations.langgraph` (``oncegate[langgraph]``):
  :func:`~oncegate.integrations.langgraph.guarded_tool`, a LangChain tool for ``ToolNode`` whose
  run is the graph's thread, so a resumed or retried graph replays.
- :mod:`oncegate.integrations.pydantic_ai` (``oncegate[pydantic-ai]``):
  :func:`~oncegate.integrations.pydantic_ai.guarded_tool`, a Pydantic AI ``Tool`` whose run comes
  from the agent run's dependencies.

And where orchestrators run agents' steps, and retry them by design:

- :mod:`oncegate.integrations.temporal` (``oncegate[temporal]``):
  :class:`~oncegate.integrations.temporal.OncegateInterceptor`, a worker interceptor guarding the
  activities marked with :func:`~oncegate.integrations.temporal.side_effect`; the run is the
  workflow run, the key the activity id, so attempt 2 of a completed activity replays attempt 1.
- :mod:`oncegate.integrations.celery` (``oncegate[celery]``):
  :func:`~oncegate.integrations.celery.guarded_task`, a task acknowledged late and rejected on
  worker loss whose run is the chain's root task and whose key is the task id, so a redelivered
  task replays.

Each is a few dozen lines over :mod:`oncegate.aio` (every one of these frameworks runs tools on an
event loop, as Temporal's workers run their interceptors; Celery's tasks use the threaded guard)
and :class:`~oncegate.guard.binding.Binding`: the protocol is the guard's, never a second one.
Never name the run by the framework's tool-call id: a retried call gets a new one, so the gate
would see a new action each time and run it again. This package imports no framework;
import the adapter you use.
"""
