"""The adapter on a Temporal worker: what puts the gate around gated activities and carries
``act_as`` from workflows to them. Internal: users import ``interlock_temporal`` (the plugin,
``gated``, the errors) and ``interlock_temporal.workflow``.

- ``plugin``: ``InterlockPlugin``, one object that installs the gate on clients and workers;
- ``install``: what a worker needs, added to its configuration (the interceptor, the review and
  reconciler workflows and activities, targets bound, the sandbox passthrough);
- ``interceptor``: ``InterlockInterceptor``, runs each activity past the policy and each gated
  one through the gate, opens the review an error needs; signs and checks the ``act_as``
  header;
- ``runtime``: one ``WorkerRuntime`` per worker on the plugin's ``GateSource`` (one gate);
- ``gated``: ``gated()`` and ``current_effect()``: an activity's declared effect, its inputs,
  the context its body runs in, and the ``Call`` one attempt of it makes (the input decoded,
  the key, the measure, who asks, which delivery, whether Temporal retries it);
- ``context``: the ``act_as`` authority and its header (imported by workflow code too);
- ``errors``: the ``ApplicationError`` types workflows see (imported by workflow code too);
- ``telemetry``, ``logs``, ``sticky``, ``codec``: spans and metrics, log lines, the sticky
  queue released after a crash, journal values through the user's payload codec.

Nothing here is imported by ``interlock_temporal`` until a name is used; ``context`` and
``errors`` are what the workflow side loads, and import no journal, storage or protocol.
"""
