"""``retire`` (also ``kubectl retire``) — watch, abort and retry retirements.

    retire list [-n NS | -A] [--all]       running and held (and ended) retirements
    retire status DEPLOYMENT [-o json|yaml]  a readable page (or the whole state)
    retire watch  DEPLOYMENT                 live progress until it ends or holds
    retire abort  DEPLOYMENT --reason R      abort (an Update; --signal to signal)
    retire retry  DEPLOYMENT [--token T]     retry a held retirement (a token is
                                             generated and printed when not given)
    retire cancel-intent DEPLOYMENT          the replica is wanted after all
    retire start  DEPLOYMENT --role R --ordinal N   start one by hand
    retire setup                             register the search attributes
    retire completion bash|zsh|tcsh          a shell completion script

As in kubectl, -n/--namespace is the Kubernetes namespace (default: the current
kubeconfig context's, else "default"), -A/--all-namespaces lists every namespace, and a
DEPLOYMENT may also be written NAMESPACE/DEPLOYMENT.  The Temporal namespace is
--temporal-namespace.

Exit codes: 0 done; 1 refused, not found, Temporal answered an error (a failed query too),
or an update got no answer in time; 2 bad arguments or bad connection configuration; 3
(watch) the retirement ended without retiring, or holds and needs a person; 130
interrupted.  Every failure is one line on stderr.  The
connection flags are shared with the worker and the watcher (``connection``): --address,
--profile, --tls-cert, ... before or after the command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import secrets
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError

from cli import render
from cli.complete import NO_FILE_COMPLETION, SHELLS, candidates, script
from cli.kubens import RefError, context_namespace, namespace_flag, resolve_ref
from cli.setup import SetupConflict, register_search_attributes
from connection.client import connect
from connection.errors import ConnectionConfigError
from connection.flags import ConnectionFlags, add_connection_flags, add_task_queue_flag
from connection.settings import ConnectionSettings, resolve
from kube.client import package_version
from retirement.budgets import Budgets
from retirement.models import (
    AbortRequest,
    RetirementRequest,
    RetirementState,
    RetryRequest,
    workflow_id_for,
)
from retirement.names import K8S_NAME
from retirement.phases import Outcome
from watcher.retirements import AlreadyRunning, Retirements, TemporalError, WorkflowNotFound
from workflows.mirror import SA_DEPLOYMENT, SA_ORDINAL, SA_OUTCOME, SA_PHASE, SA_ROLE


class UsageError(Exception):
    """Bad command-line input."""


def version() -> str:
    """The installed package's version, or ``unknown`` when it runs from a bare tree."""
    return package_version()


def new_retry_token(now: datetime | None = None) -> str:
    """A fresh retry token: ``cli-<UTC time>-<8 hex>`` (29 characters, within the token
    rule of ``retirement.retry.validate_token``)."""
    return f"cli-{(now or datetime.now(UTC)):%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"


#: How long ``status`` waits for the state by default (a query waits for a worker).
STATUS_TIMEOUT_S = 30.0


def parser() -> argparse.ArgumentParser:
    """The argument parser."""
    invoked = os.path.basename(sys.argv[0]) if sys.argv else ""
    p = argparse.ArgumentParser(
        prog="kubectl retire" if invoked.startswith("kubectl-") else "retire",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    add_connection_flags(p)
    add_task_queue_flag(p)
    sub = p.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="running and held retirements (Temporal visibility)")
    ls.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="every Kubernetes namespace (default: the one -n names)",
    )
    ls.add_argument("--in", dest="scope", metavar="NAMESPACE", help=argparse.SUPPRESS)
    ls.add_argument("--all", action="store_true", help="also the ones that ended")
    ls.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    ls.add_argument(
        "--limit", type=int, default=None, help="at most this many retirements, newest first"
    )
    s = sub.add_parser("status", help="one retirement as a readable page, or -o json|yaml")
    s.add_argument("ref")
    s.add_argument("-o", "--output", choices=["page", "json", "yaml"], default="page")
    s.add_argument(
        "--timeout",
        type=float,
        default=STATUS_TIMEOUT_S,
        help=f"give up after this many seconds (exit 1; default {STATUS_TIMEOUT_S:g}: a"
        " running retirement's state needs a worker to answer)",
    )
    wt = sub.add_parser("watch", help="live progress until the retirement ends or holds")
    wt.add_argument("ref")
    wt.add_argument("--interval", type=float, default=1.0, help="seconds between reads")
    wt.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="give up after this many seconds (exit 1; the retirement goes on)",
    )
    sub.add_parser("setup", help="register the search attributes on the namespace")
    comp = sub.add_parser("completion", help="print a shell completion script")
    comp.add_argument("shell", choices=SHELLS)
    a = sub.add_parser("abort", help="abort before any delete: the replica is kept, serving")
    a.add_argument("ref")
    a.add_argument("--reason", required=True)
    a.add_argument("--signal", action="store_true", help="send a signal instead of an update")
    r = sub.add_parser("retry", help="a fresh attempt of a held retirement")
    r.add_argument("ref")
    r.add_argument(
        "--token",
        help="the retry's token (sending the same token again is not a second retry);"
        " without it one is generated and printed",
    )
    r.add_argument("--signal", action="store_true")
    c = sub.add_parser("cancel-intent", help="the replica is wanted after all")
    c.add_argument("ref")
    c.add_argument("--reason", default="the spec re-declares the ordinal")
    st = sub.add_parser("start", help="start a retirement by hand")
    st.add_argument("ref")
    st.add_argument("--role", required=True)
    st.add_argument("--ordinal", required=True, type=int)
    st.add_argument("--budgets", default="{}", help='JSON, e.g. {"overall_s": 300, "drain_s": 240}')
    st.add_argument("--routerless-policy", default="hold", choices=["hold", "quiet-window"])
    _add_namespace_flag(p)
    for each in sub.choices.values():  # the connection flags after the subcommand too
        add_connection_flags(each, repeated=True)
        add_task_queue_flag(each, repeated=True)
        _add_namespace_flag(each, repeated=True)
    return p


def _add_namespace_flag(parser: argparse.ArgumentParser, *, repeated: bool = False) -> None:
    """kubectl's ``-n/--namespace`` (on a subcommand without a default, so a value given
    before the subcommand survives its parse)."""
    parser.add_argument(
        "-n",
        "--namespace",
        dest="k8s_namespace",
        metavar="NS",
        default=argparse.SUPPRESS if repeated else None,
        help="Kubernetes namespace (default: the current kubeconfig context's, else default)",
    )


#: The command-line names of the request fields a validation error can name.
FIELD_FLAGS = {
    "token": "--token",
    "reason": "--reason",
    "role": "--role",
    "ordinal": "--ordinal",
    "budgets": "--budgets",
    "routerless_policy": "--routerless-policy",
    "namespace": "NAMESPACE",
    "deployment": "DEPLOYMENT",
}
_GOT_WIDTH = 40


def _what_is_wrong(err: Mapping[str, Any]) -> str:
    """One pydantic error as the project says it: the rule a model states itself (a
    ``ValueError`` of a validator), else pydantic's own words as ``must ...``."""
    kind, ctx, given = err["type"], err.get("ctx") or {}, err.get("input")
    if isinstance(given, float) and not math.isfinite(given):
        return "must be a finite number"
    if kind == "value_error" and "error" in ctx:
        return str(ctx["error"])
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a known field"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return 'must be a JSON object, e.g. {"overall_s": 300}'
    if kind == "string_too_short" and ctx.get("min_length") == 1:
        return "must not be empty"
    if kind == "string_pattern_mismatch" and ctx.get("pattern") == K8S_NAME:
        return (
            "must be lower-case letters, digits, '-' or '.', starting and ending with a"
            " letter or digit"
        )
    msg = str(err["msg"])
    for said in ("Input should", "String should", "Value should"):
        if msg.startswith(said):
            return "must" + msg[len(said) :]
    return msg


def _got(given: Any, *, as_json: bool) -> str:
    if isinstance(given, str) and len(given) > _GOT_WIDTH:
        return f" (got {len(given)} characters)"
    try:
        shown = json.dumps(given) if as_json else repr(given)
    except (TypeError, ValueError):  # not from JSON after all
        shown = repr(given)
    return f" (got {shown[: _GOT_WIDTH - 1]}…)" if len(shown) > _GOT_WIDTH else f" (got {shown})"


def validation_message(
    e: ValidationError, *, flag: str | None = None, known: Iterable[str] = ()
) -> str:
    """A ValidationError as one line naming each field and what is wrong with it, e.g.
    ``--token: a retry token is 1-63 characters ... (got '')``; ``flag`` names the
    command-line argument the whole model came from (``--budgets``), ``known`` its
    fields (named when an unknown one is given)."""
    parts = []
    for err in e.errors(include_url=False):
        loc, named = [str(x) for x in err["loc"]], flag
        if named is None and loc:
            named, loc = FIELD_FLAGS.get(loc[0], loc[0]), loc[1:]
        where = ".".join(loc)
        if err["type"] == "extra_forbidden":
            what = f"{where!r} {_what_is_wrong(err)}"
            what += f" (known: {', '.join(known)})" if known else ""
        else:
            what = f"{where} {_what_is_wrong(err)}" if where else _what_is_wrong(err)
            given = err.get("input")
            what += "" if isinstance(given, dict) else _got(given, as_json=flag is not None)
        parts.append(f"{named}: {what}" if named else what)
    return "; ".join(parts)


def _validated(build: Any, *, flag: str | None = None, known: Iterable[str] = ()) -> Any:
    try:
        return build()
    except ValidationError as e:
        raise UsageError(validation_message(e, flag=flag, known=known)) from e
    except ValueError as e:
        raise UsageError(f"{flag}: {e}" if flag else str(e)) from e


def parse_budgets(text: str) -> Budgets:
    """``--budgets`` JSON → Budgets; UsageError when it is not valid JSON or not budgets."""
    try:
        raw = json.loads(text)
    except RecursionError as e:  # nested deeper than the parser can follow
        raise UsageError("--budgets: JSON nested too deeply") from e
    except ValueError as e:
        raise UsageError(f"--budgets: not valid JSON: {e}") from e
    budgets: Budgets = _validated(
        lambda: Budgets.model_validate(raw), flag="--budgets", known=Budgets.model_fields
    )
    return budgets


#: The columns of ``retire list``.
LIST_HEADER = ("DEPLOYMENT", "REPLICA", "PHASE", "OUTCOME", "AGE", "DEADLINE", "WORKFLOW", "REASON")
#: Concurrent reads of ``retire list`` (one query or result per retirement listed), and
#: the bound of each: a running retirement whose worker is down cannot answer its query.
LIST_READS = 16
LIST_READ_TIMEOUT_S = 2.0
REASON_WIDTH = 80


def list_query(*, everything: bool, scope: str | None = None) -> str:
    """The visibility query of ``retire list`` (the search attributes the UI filters on):
    the server filters by Kubernetes namespace (``scope``, already checked to be a DNS
    label, so it cannot break out of the quotes)."""
    query = "WorkflowType = 'Retirement'"  # @workflow.defn(name="Retirement")
    if scope is not None:
        query += f" AND {SA_DEPLOYMENT.name} STARTS_WITH '{scope}/'"
    return query if everything else query + " AND ExecutionStatus = 'Running'"


def _age(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 60:.0f}m" if seconds >= 120 else f"{seconds:.0f}s"


async def _deadline_and_reason(retirements: Retirements, wf: Any, now: datetime) -> tuple[str, str]:
    """The phase deadline (``in 42s``; ``held`` while held) and the last reason of one
    listed retirement, read from its state (a query while it runs, its result once it
    ended); ``-`` where it cannot be read."""
    bound = timedelta(seconds=LIST_READ_TIMEOUT_S)
    try:
        if wf.status is WorkflowExecutionStatus.RUNNING:
            # A query needs a worker: with none polling it would wait; the row says "-".
            st = await retirements.state(wf.id, run_id=wf.run_id, rpc_timeout=bound)
        else:
            st = await retirements.result(wf.id, run_id=wf.run_id, rpc_timeout=bound)
    except Exception:  # terminated, failed, or not answerable now: the row still prints
        return "-", "-"
    if st.outcome is Outcome.ABORTED and not st.restoring:
        deadline = "held"
    elif st.outcome is Outcome.RUNNING and st.phase_deadline is not None:
        deadline = f"in {_age(max(0.0, (st.phase_deadline - now).total_seconds()))}"
    else:
        deadline = "-"
    reason = " ".join(st.reason.split())
    if len(reason) > REASON_WIDTH:
        reason = reason[: REASON_WIDTH - 1] + "…"
    return deadline, reason or "-"


async def list_retirements(
    retirements: Retirements,
    *,
    scope: str | None,
    everything: bool,
    output: str = "table",
    limit: int | None = None,
) -> int:
    """Print one line per retirement, newest first: its search attributes, and the phase
    deadline and last reason read from its state (``output`` json or yaml: one object per
    retirement, the table's columns as keys); at most ``limit`` of them."""
    now = datetime.now(UTC)
    listed: list[tuple[Any, str]] = []
    async for wf in retirements.each(list_query(everything=everything, scope=scope)):
        deployment = wf.typed_search_attributes.get(SA_DEPLOYMENT) or wf.id.removeprefix(
            "retirement/"
        )
        if scope is None or deployment.startswith(f"{scope}/"):
            listed.append((wf, deployment))
            if limit is not None and len(listed) >= limit:
                break
    gate = asyncio.Semaphore(LIST_READS)

    async def read(wf: Any) -> tuple[str, str]:
        async with gate:
            return await _deadline_and_reason(retirements, wf, now)

    details = await asyncio.gather(*(read(wf) for wf, _ in listed))
    rows: list[tuple[str, ...]] = []
    for (wf, deployment), (deadline, reason) in zip(listed, details, strict=True):
        sa = wf.typed_search_attributes
        replica = f"{sa.get(SA_ROLE) or '?'}:{sa.get(SA_ORDINAL)}"
        age = _age((now - wf.start_time).total_seconds()) if wf.start_time else "?"
        phase, outcome = sa.get(SA_PHASE) or "?", sa.get(SA_OUTCOME) or "?"
        cells = (deployment, replica, phase, outcome, age, deadline, wf.id, reason)
        rows.append(tuple(render.printable(c) for c in cells))  # reasons come from outside
    if output != "table":
        keys = [h.lower() for h in LIST_HEADER]
        print(render.serialize([dict(zip(keys, r, strict=True)) for r in rows], output))
        return 0
    widths = [max(len(r[i]) for r in [LIST_HEADER, *rows]) for i in range(len(LIST_HEADER))]
    for row in [LIST_HEADER, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


#: ``retire watch``'s exit code when the retirement ended without retiring, or holds.
NEEDS_A_LOOK = 3


def _changes(st: RetirementState) -> tuple[Any, ...]:
    """What a watcher of a retirement wants to be told about when it changes."""
    return (st.phase, st.outcome, st.attempt, st.reasons[-1:], st.last_readings, st.unrestored)


async def watch(
    retirements: Retirements, wid: str, *, interval: float, timeout: float | None = None
) -> int:
    """Print the page whenever the retirement changes, until it ends (0 when it retired
    the replica, else 3) or holds after an abort (3); after ``timeout`` seconds, 1 (the
    retirement goes on: watching it is what stops)."""
    if timeout is not None:
        try:
            return await asyncio.wait_for(watch(retirements, wid, interval=interval), timeout)
        except TimeoutError:  # a query with no worker to answer it waits too: bounded here
            _error(f"{wid} still runs after --timeout {timeout:g} s (it goes on)")
            return 1
    seen: tuple[Any, ...] | None = None
    while True:
        desc = await retirements.describe(wid)
        if not desc.running:
            try:
                st = await retirements.result(wid)
            except WorkflowFailureError as e:
                _error(f"{wid} ended {_status(desc.status)}: {e.cause}")
                return NEEDS_A_LOOK
            print(render.page(st, datetime.now(UTC)), flush=True)
            return 0 if st.outcome is Outcome.COMPLETED else NEEDS_A_LOOK
        st = await retirements.state(wid)
        if _changes(st) != seen:
            seen = _changes(st)
            print(f"--- {datetime.now(UTC):%H:%M:%S} UTC", flush=True)
            print(render.page(st, datetime.now(UTC)), flush=True)
        if st.outcome is Outcome.ABORTED and st.restoring is False:
            _error(f"{wid} holds: it needs a retry or a cancel-intent")
            return NEEDS_A_LOOK
        await asyncio.sleep(interval)


async def run(args: argparse.Namespace, *, connection: ConnectionSettings) -> int:
    """Execute one command; returns the exit code."""
    if args.command == "setup":
        try:
            lines = await register_search_attributes(
                await connect(connection), namespace=connection.namespace
            )
        except SetupConflict as e:
            _error(f"setup: {e}")
            return 1
        except RPCError as e:
            _error(f"setup: {e.status.name}: {e.message}")
            return 1
        print(f"namespace {connection.namespace}:")
        print("\n".join(f"  {line}" for line in lines))
        return 0
    try:
        namespace = namespace_flag(args.k8s_namespace)
        if args.command == "list" and args.scope is not None:  # the old spelling of -n
            if namespace is not None and namespace != args.scope:
                raise RefError(f"--in {args.scope!r} and -n {namespace!r} disagree: give one")
            namespace = namespace_flag(args.scope)
        if args.command == "list":
            if args.all_namespaces and namespace is not None:
                raise RefError("-A (every namespace) and -n (one) disagree: give one")
            scope = None if args.all_namespaces else namespace or context_namespace()
        else:
            ns, md = resolve_ref(args.ref, namespace, context_namespace)
    except RefError as e:
        raise UsageError(str(e)) from e
    if args.command == "list":
        if args.limit is not None and args.limit < 1:
            raise UsageError("--limit must be at least 1")
        try:
            return await list_retirements(
                Retirements(await connect(connection)),
                scope=scope,
                everything=args.all,
                output=args.output,
                limit=args.limit,
            )
        except TemporalError as e:
            _error(f"{e.status.name}: {e.message}")
            return 1
    wid = workflow_id_for(namespace=ns, deployment=md)
    if args.command == "watch":
        if not math.isfinite(args.interval):
            raise UsageError("--interval must be a finite number of seconds")
        if args.interval <= 0:
            raise UsageError("--interval must be positive")
        if args.timeout is not None and not (math.isfinite(args.timeout) and args.timeout > 0):
            raise UsageError("--timeout must be a positive, finite number of seconds")
    elif args.command == "status":
        if not (math.isfinite(args.timeout) and args.timeout > 0):
            raise UsageError("--timeout must be a positive, finite number of seconds")
    elif args.command == "abort":
        abort_req = _validated(lambda: AbortRequest(reason=args.reason))
    elif args.command == "retry":
        token = new_retry_token() if args.token is None else args.token
        retry_req = _validated(lambda: RetryRequest(token=token))
        if args.token is None:
            print(
                f"retry token {token} (generated: sending it again with --token {token}"
                " is not a second retry)",
                flush=True,
            )
    elif args.command == "start":
        budgets = parse_budgets(args.budgets)
        start_req = _validated(
            lambda: RetirementRequest(
                namespace=ns,
                deployment=md,
                role=args.role,
                ordinal=args.ordinal,
                budgets=budgets,
                routerless_policy=args.routerless_policy,
            )
        )
    retirements = Retirements(await connect(connection))
    try:
        if args.command == "status":
            try:
                st = await asyncio.wait_for(_read(retirements, wid), args.timeout)
            except TimeoutError:
                _error(
                    f"status: {wid} gave no answer within --timeout {args.timeout:g} s"
                    f" (is a worker polling task queue {args.task_queue!r}?)"
                )
                return 1
            out = args.output
            print(render.page(st, datetime.now(UTC)) if out == "page" else render.machine(st, out))
        elif args.command == "watch":
            return await watch(retirements, wid, interval=args.interval, timeout=args.timeout)
        elif args.command == "abort":
            if args.signal:
                await retirements.abort_signal(wid, abort_req)
                print(f"abort signalled to {wid}")
            else:
                print(await retirements.abort(wid, abort_req))
        elif args.command == "retry":
            if args.signal:
                await retirements.retry_signal(wid, retry_req)
                print(f"retry signalled to {wid}")
            else:
                res = await retirements.retry(wid, retry_req)
                print(f"{res.decision}: {res.message}")
        elif args.command == "cancel-intent":
            await retirements.cancel_intent(wid, args.reason)
            print(f"cancel-intent signalled to {wid}")
        elif args.command == "start":
            await retirements.start(start_req, workflow_id=wid, task_queue=args.task_queue)
            print(f"started {wid}")
    except WorkflowUpdateFailedError as e:
        _error(f"refused: {e.cause}")
        return 1
    # The SDK's own errors of a query (status, watch) or an update (abort, retry): not
    # RPCErrors, so each is named here or it ends in a traceback.
    except WorkflowQueryFailedError as e:  # the worker answered: its query handler failed
        _error(
            f"{args.command}: {wid} failed its state query: {_one_line(e.message)};"
            " see the worker's log (is a worker of this version running?), then try again",
        )
        return 1
    except WorkflowQueryRejectedError as e:
        _error(
            f"{args.command}: {wid} refused its state query ({_status(e.status)});"
            f" read it again with: retire status {ns}/{md}",
        )
        return 1
    except WorkflowUpdateRPCTimeoutOrCancelledError:  # the call's bound, not the update's
        _error(
            f"{args.command}: {wid} gave no answer in time (is a worker running?);"
            f" the {args.command} may still apply: check retire status {ns}/{md} before"
            " sending it again, or send it with --signal",
        )
        return 1
    except AlreadyRunning:
        _error(f"a retirement of {ns}/{md} is already running ({wid})")
        return 1
    except NotRetirement as e:
        _error(f"{e}")
        return 1
    except WorkflowNotFound:
        _error(f"no retirement of {ns}/{md} ({wid})")
        return 1
    except TemporalError as e:
        _error(f"{e.status.name}: {e.message}")
        return 1
    return 0


async def _read(retirements: Retirements, wid: str) -> RetirementState:
    """The state of a running retirement (query), or of an ended one (its result)."""
    desc = await retirements.describe(wid)
    if desc.running:
        return await retirements.state(wid)
    try:
        return await retirements.result(wid)
    except WorkflowFailureError as e:
        raise NotRetirement(f"{wid} ended {_status(desc.status)}: {e.cause}") from e


def _status(status: WorkflowExecutionStatus | None) -> str:
    return status.name if status is not None else "?"


def _one_line(text: str) -> str:
    """A worker's message (it may carry newlines) as part of the one stderr line."""
    line = " ".join(text.split())
    return line if len(line) <= 300 else line[:299] + "…"


class NotRetirement(Exception):
    """The workflow has no state to show (it failed, or was terminated)."""


def _error(message: str) -> None:
    """One line on stderr, ``retire: <message>``: server answers and reasons come from
    outside, so control characters are shown as escapes (``render.printable``)."""
    print(f"retire: {render.printable(message)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    p = parser()
    args = p.parse_args(argv)
    if args.command == "completion":  # needs no connection
        # For the `retire` command even when run as `kubectl retire`: a script bound to
        # "kubectl" would replace kubectl's own completion (kubectl_complete-retire serves
        # the plugin).
        p.prog = "retire"
        print(script(p, args.shell))
        return 0
    try:
        connection = resolve(ConnectionFlags.from_args(args), environ=os.environ)
    except ConnectionConfigError as e:
        _error(f"{e}")
        return 2
    try:
        return asyncio.run(run(args, connection=connection))
    except KeyboardInterrupt:
        return 130
    except UsageError as e:
        _error(f"{e}")
        return 2
    except (OSError, RuntimeError) as e:
        _error(f"cannot reach Temporal at {connection.address}: {e}")
        return 1


def kubectl_complete() -> None:
    """``kubectl_complete-retire``: kubectl's plugin completion (the words typed so far in,
    one candidate per line and ``:<directive>`` out)."""
    for word in candidates(parser(), sys.argv[1:]):
        print(word)
    print(f":{NO_FILE_COMPLETION}")


def entry() -> None:
    """The ``retire`` / ``kubectl-retire`` executables and ``python -m cli``: run ``main``,
    then leave at once.  The Temporal SDK's native runtime may still hold threads when the
    interpreter finalizes, and a normal exit then sometimes aborts after the work is done
    (``Fatal Python error: PyGILState_Release``, SIGABRT: temporalio/sdk-python#300;
    measured: 1 in 30 runs of ``retire list`` in plaintext, 3 in 30 over TLS).  Nothing is
    left to clean up once ``main`` returned: flush the output and exit with its code."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
