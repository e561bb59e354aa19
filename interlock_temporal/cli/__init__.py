"""``interlock``: the operator's view of a journal, and of the reviews and reconciler on Temporal.

    interlock --version
    interlock [--journal URL] [--signing-key KEY] journal verify [--head SEQ:HASH] [--json]
    interlock journal head [--json]
    interlock effects list [--state KIND | --in-doubt] [--older-than AGE] [--limit N] [--json]
    interlock effects show EFFECT_ID [--json]
    interlock effects reopen EFFECT_ID --operator O [--note N]
    interlock leases issue PRINCIPAL [--activity A]... [--max-amount-cents N] [--budget-cents N]
                           [--resource R]... [--ttl 1h|30m|90s] [--json]
    interlock leases revoke LEASE_ID
    interlock leases list [--json]

On a Temporal server (``--address``, default ``$TEMPORAL_ADDRESS``, else ``localhost:7233``;
``--namespace``, default ``$TEMPORAL_NAMESPACE``, else ``default``):

    interlock reviews list [--all] [--limit N] [--json]
    interlock reviews resolve EFFECT_ID --decision D --operator O [--note N]
                              [--kind ambiguous|approval] [--result JSON] [--timeout AGE]
                              [--json]
    interlock reconcile --task-queue Q [--older-than AGE] [--limit N] [--timeout AGE] [--json]

Exit codes: 0 ok; 1 a check failed or there was nothing to do; 2 usage error or not found;
3 the journal cannot be opened, or the Temporal server cannot be reached (the table is
``_shared.EPILOG``, shown by ``interlock --help``; docs/operator-guide.md repeats it). Errors are
one line on stderr, never a traceback (set ``INTERLOCK_DEBUG=1`` to see one for an unexpected
error). Temporal is imported only by the commands that talk to a server. Every listing takes
``--json``; durations need a unit (``45s``, ``30m``, ``1h``, ``2d``); every subcommand's
``--help`` ends with examples.

One module per noun (``journal``, ``effects``, ``leases``, ``report``, ``circuit``, ``reviews``,
``reconcile``), each with ``register(groups)`` adding its subcommands; a new verb goes in its
noun's module, a new noun gets a module listed in ``_app.NOUNS``. What they share: ``_shared``
(exit codes, ``CliError``, output, opening the journal), ``_args`` (argument types, the parser's
pieces), ``_temporal`` (the client, RPC failures as one line), ``_render`` (receipts, entries,
effects, leases, reviews and reconcile reports as plain text; the demo prints with it too).
"""

from ._app import build_parser, main
from ._args import parse_duration
from .reconcile import needs_nobody

__all__ = ["build_parser", "main", "needs_nobody", "parse_duration"]
