"""The server-side functions every PostgreSQL write goes through, and the guard statement.

Every write a writer makes while charging goes through one of five ``SECURITY DEFINER``
functions owned by the schema's owner (each with ``search_path = pg_catalog, pg_temp``
and ``EXECUTE`` revoked from ``PUBLIC``), so a role granted a ledger
(`dpaccount.storage.postgres.roles`) needs no privilege on the tables:

``dpaccount_append_within_v4``
    the basic rule decided on the cached sums (`PostgresStore.append_within`);
``dpaccount_append_one_v1``
    compare-and-append of one record (one statement, as the store's compare-and-append
    was before: a plpgsql loop over ledgers measured about 130 us more a charge);
``dpaccount_append_at_v1``
    compare-and-append of one record to each of one or more ledgers, all or none;
``dpaccount_lock_v1``
    lock ledger rows (``FOR UPDATE``, in name order) and read their tips and records,
    for a decision under the lock;
``dpaccount_snapshot_v1``
    store a snapshot of a ledger's tip.

Each one first asks ``dpaccount_may_write_v1`` whether the role the connection logged in
as (``session_user``) may write those ledgers together (unless it is a member of the
owner: the functions' owner, ``current_user`` inside them), and compares, under the row
lock, the ledger's tip with the one the writer saw last (`check_extends` says what that
means) and its stored settings with the writer's. The functions know nothing of
differential privacy: they compare stored numbers with numbers they are given.

`guard_sql` is the statement every write transaction runs just before its ``COMMIT``:
it fails unless the pinned functions and triggers are unchanged and the session's
``session_replication_role`` is ``origin`` (see docs/ledgers.md, "Fail closed inside the
deciding transaction").
"""

from __future__ import annotations

from dpaccount.errors import LedgerCorruptError
from dpaccount.records import GENESIS_HASH
from dpaccount.storage._sql import SUM_BITS

#: The bounded exact addition of two "num/den" texts (created with the tables, see
#: `dpaccount.storage.postgres.schema`): the one the sums trigger checks each move with.
ADD_FUNCTION = "dpaccount_add_bounded_v1"

__all__ = [
    "ADD_FUNCTION",
    "APPEND_AT_FUNCTION",
    "APPEND_ONE_FUNCTION",
    "CMP_FUNCTION",
    "DEFINER_FUNCTIONS",
    "GUARD_TAG",
    "LOCK_FUNCTION",
    "MAY_WRITE_FUNCTION",
    "ORDER_FUNCTION",
    "SEARCH_PATH",
    "SIGNATURES",
    "SNAPSHOT_FUNCTION",
    "WITHIN_V4_FUNCTION",
    "FunctionChangedError",
    "definer_sql",
    "guard_sql",
]

WITHIN_V4_FUNCTION = "dpaccount_append_within_v4"
APPEND_ONE_FUNCTION = "dpaccount_append_one_v1"
APPEND_AT_FUNCTION = "dpaccount_append_at_v1"
LOCK_FUNCTION = "dpaccount_lock_v1"
SNAPSHOT_FUNCTION = "dpaccount_snapshot_v1"
MAY_WRITE_FUNCTION = "dpaccount_may_write_v1"
CMP_FUNCTION = "dpaccount_cmp_v1"
ORDER_FUNCTION = "dpaccount_order_v1"

#: The functions a writer role is granted ``EXECUTE`` on (name -> argument types).
SIGNATURES = {
    WITHIN_V4_FUNCTION: "text, bigint, text, text, text, text, text, text, text, text, "
    "text, bigint, text, text, text",
    APPEND_ONE_FUNCTION: "text, bigint, text, text, text, text, text, text, text, text, text",
    APPEND_AT_FUNCTION: "text[], bigint[], text[], text[], text[], text[], text[], text[], "
    "text[], text[], text[]",
    LOCK_FUNCTION: "text[], bigint[]",
    SNAPSHOT_FUNCTION: "text, bigint, text, text, text, text, text, text, text",
}
#: The ``SECURITY DEFINER`` functions: checked to run with `SEARCH_PATH`, owned by the
#: tables' owner.
DEFINER_FUNCTIONS = frozenset(SIGNATURES)
#: Their ``proconfig``.
SEARCH_PATH = "search_path=pg_catalog, pg_temp"

#: What the guard's failure says (an integer cast of this text fails, aborting the
#: transaction), followed by what changed.
GUARD_TAG = "dpaccount guard: "

_DEFINER = "SECURITY DEFINER SET search_path = pg_catalog, pg_temp"


class FunctionChangedError(LedgerCorruptError):
    """The guard found a pinned function's catalog row changed since it was pinned (its
    source or settings, or only its privileges: a ``GRANT``). The store checks the
    functions again and, if they are still dpaccount's, pins them anew and retries the
    write once; otherwise this is the error."""


def guard_sql(tables: str, triggers: tuple[str, str, int], functions: tuple[str, str, int]
              ) -> str:
    """The guard statement for the pins it is given, each an SQL array literal: the
    ledger tables' oids; the (non-internal) triggers on them as (oids, ``xmin`` values,
    count); the functions as (oids, ``xmin`` values, count). A catalog row's ``xmin``
    changes with every ``ALTER``, ``CREATE OR REPLACE``, ``DISABLE`` or ``ENABLE``, and a
    new row (a dropped and re-created trigger, another trigger) has a new oid, so the
    statement returns no row while everything is as pinned, and otherwise fails with
    `GUARD_TAG` and ``triggers``, ``functions`` or ``session_replication_role``."""
    trigger_oids, trigger_xmins, trigger_count = triggers
    function_oids, function_xmins, function_count = functions
    return (
        f"SELECT ('{GUARD_TAG}' || w.what)::integer FROM (SELECT CASE "
        "WHEN pg_catalog.current_setting('session_replication_role') <> 'origin' "
        "THEN 'session_replication_role' "
        f"WHEN NOT (SELECT count(*) = {trigger_count} AND count(*) FILTER (WHERE "
        f"t.oid = ANY ({trigger_oids}::oid[]) AND t.xmin = ANY ({trigger_xmins}::xid[])) "
        f"= {trigger_count} FROM pg_catalog.pg_trigger t WHERE t.tgrelid = ANY "
        f"({tables}::oid[]) AND NOT t.tgisinternal) THEN 'triggers' "
        f"WHEN (SELECT count(*) FROM pg_catalog.pg_proc p WHERE p.oid = ANY "
        f"({function_oids}::oid[]) AND p.xmin = ANY ({function_xmins}::xid[])) "
        f"<> {function_count} THEN 'functions' END AS what) w WHERE w.what IS NOT NULL"
    )


def definer_sql(s: str) -> list[str]:
    """The helper functions and the five writer functions of schema ``s`` (quoted)."""
    return [_cmp_sql(s), _order_sql(s), _may_write_sql(s), _within_sql(s),
            _append_one_sql(s), _append_at_sql(s), _lock_sql(s), _snapshot_sql(s)]


def _order_sql(s: str) -> str:
    # The subscripts of p_names in name order (rows are locked in that order, so that
    # writers of overlapping groups cannot deadlock); one name needs no sort.
    return f"""CREATE OR REPLACE FUNCTION {s}.{ORDER_FUNCTION}(p_names text[]) RETURNS integer[]
LANGUAGE sql IMMUTABLE AS $fn$
SELECT CASE WHEN cardinality(p_names) = 1 THEN ARRAY[1] ELSE ARRAY(
    SELECT o.i::integer FROM unnest(p_names) WITH ORDINALITY AS o(name, i) ORDER BY o.name
) END
$fn$"""


def _cmp_sql(s: str) -> str:
    # The sign of a - b for two "num/den" texts (denominators positive).
    return f"""CREATE OR REPLACE FUNCTION {s}.{CMP_FUNCTION}(a text, b text) RETURNS integer
LANGUAGE sql IMMUTABLE AS $fn$
SELECT CASE WHEN a = b THEN 0 ELSE pg_catalog.sign(
    pg_catalog.split_part(a, '/', 1)::numeric * pg_catalog.split_part(b, '/', 2)::numeric
    - pg_catalog.split_part(b, '/', 1)::numeric * pg_catalog.split_part(a, '/', 2)::numeric
)::integer END
$fn$"""


def _may_write_sql(s: str) -> str:
    # Whether session_user may write the ledgers p_names together: the owner (a member of
    # the role that owns the calling SECURITY DEFINER function) always; another role if
    # each ledger was granted to it for writing with every ledger its grant needs (a
    # share's ancestors) in the group, or is one of those. p_own: each ledger's own
    # write grant suffices (snapshots).
    return f"""CREATE OR REPLACE FUNCTION {s}.{MAY_WRITE_FUNCTION}(p_names text[], p_own boolean)
RETURNS boolean LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF pg_has_role(session_user, current_user, 'MEMBER') THEN
        RETURN true;
    END IF;
    RETURN NOT EXISTS (
        SELECT 1 FROM unnest(p_names) AS n(name)
        WHERE NOT EXISTS (
            SELECT 1 FROM {s}.grants g
            WHERE g.access = 'write' AND pg_has_role(session_user, g.role, 'MEMBER')
              AND (p_own OR g.needs <@ p_names)
              AND (g.ledger = n.name OR (NOT p_own AND n.name = ANY (g.needs)
                                         AND g.ledger = ANY (p_names)))));
END
$fn$"""


# The tip check every writer function makes under the row lock (v_head, v_last, v_eps,
# v_delta: the locked row; p_seen_*: the tip the writer saw last, NULL if none): sets
# v_bad to 'behind', 'tampered' or 'diverged', or leaves it NULL.
_SEEN_CHECK = """
    IF p_seen_head IS NOT NULL THEN
        IF v_head < p_seen_head THEN
            v_bad := 'behind';
        ELSIF v_head = p_seen_head THEN
            IF v_last IS DISTINCT FROM p_seen_hash
               OR {s}.{cmp}(v_eps, p_seen_eps) <> 0
               OR {s}.{cmp}(v_delta, p_seen_delta) <> 0 THEN
                v_bad := 'tampered';
            END IF;
        ELSE
            IF p_seen_head = 0 THEN
                v_anchor := '{genesis}';
            ELSE
                SELECT r.hash INTO v_anchor FROM {s}.records r
                    WHERE r.ledger = p_name AND r.seq = p_seen_head - 1;
            END IF;
            IF v_anchor IS DISTINCT FROM p_seen_hash THEN
                v_bad := 'diverged';
            ELSIF {s}.{cmp}(v_eps, p_seen_eps) < 0
                  OR {s}.{cmp}(v_delta, p_seen_delta) < 0 THEN
                v_bad := 'tampered';{adds_up}
            END IF;
        END IF;
    END IF;"""

# The records since the tip the writer saw must add up, from its sums, to the cached ones:
# a cache reset behind the writer's back (or moved forward without adding a record's
# cost) is tampering. The cost is read from each payload as the sums trigger reads it,
# and added exactly (a common denominator is kept as is); the cache adds each cost
# rounding a sum up by less than 2^-SUM_BITS where its denominator would pass SUM_BITS,
# so it must lie between the exact sum and the exact sum plus one such step per record.
_ADDS_UP = """
            ELSE
                v_en := split_part(p_seen_eps, '/', 1)::numeric;
                v_ed := split_part(p_seen_eps, '/', 2)::numeric;
                v_dn := split_part(p_seen_delta, '/', 1)::numeric;
                v_dd := split_part(p_seen_delta, '/', 2)::numeric;
                v_k := 0;
                FOR v_text, v_ce, v_cd IN
                    SELECT substr(c.rest, length(c.delta) + 1, 13),
                           split_part(substr(c.rest, length(c.delta) + 14), '"', 1), c.delta
                    FROM (SELECT substr(r.payload, strpos(r.payload, '"cost":{{"delta":"')
                                        + 17) AS rest,
                                 strpos(r.payload, '"cost":{{"delta":"') AS at
                          FROM {s}.records r
                          WHERE r.ledger = p_name AND r.seq >= p_seen_head
                            AND r.seq < v_head) p,
                         LATERAL (SELECT p.rest, CASE WHEN p.at > 0
                                  THEN split_part(p.rest, '"', 1) END AS delta) c
                LOOP
                    IF v_cd IS NULL OR v_text <> '","epsilon":"' THEN
                        v_k := NULL;
                        EXIT;
                    END IF;
                    v_n := split_part(v_ce, '/', 1)::numeric;
                    v_d := coalesce(nullif(split_part(v_ce, '/', 2), ''), '1')::numeric;
                    IF v_d = v_ed THEN
                        v_en := v_en + v_n;
                    ELSE
                        v_en := v_en * v_d + v_n * v_ed; v_ed := v_ed * v_d;
                    END IF;
                    v_n := split_part(v_cd, '/', 1)::numeric;
                    v_d := coalesce(nullif(split_part(v_cd, '/', 2), ''), '1')::numeric;
                    IF v_d = v_dd THEN
                        v_dn := v_dn + v_n;
                    ELSE
                        v_dn := v_dn * v_d + v_n * v_dd; v_dd := v_dd * v_d;
                    END IF;
                    v_k := v_k + 1;
                END LOOP;
                v_scale := trunc(2::numeric ^ {bits});
                IF v_k IS NULL
                   OR split_part(v_eps, '/', 1)::numeric * v_ed
                      < v_en * split_part(v_eps, '/', 2)::numeric
                   OR split_part(v_eps, '/', 1)::numeric * v_ed * v_scale
                      > (v_en * v_scale + v_k * v_ed) * split_part(v_eps, '/', 2)::numeric
                   OR split_part(v_delta, '/', 1)::numeric * v_dd
                      < v_dn * split_part(v_delta, '/', 2)::numeric
                   OR split_part(v_delta, '/', 1)::numeric * v_dd * v_scale
                      > (v_dn * v_scale + v_k * v_dd) * split_part(v_delta, '/', 2)::numeric
                THEN
                    v_bad := 'tampered';
                END IF;"""


def _seen_check(s: str, exact: bool) -> str:
    """The tip check; with ``exact`` (a function that decides on the cached sums) the
    records since the tip seen must also add up to them."""
    adds_up = _ADDS_UP.format(s=s, bits=SUM_BITS) if exact else ""
    return _SEEN_CHECK.format(s=s, cmp=CMP_FUNCTION, genesis=GENESIS_HASH, adds_up=adds_up)


def _within_sql(s: str) -> str:
    # As dpaccount_append_within_v3 (see schema.append_within_sql), run as the owner for
    # granted roles, and checking the tip against the one the caller saw last
    # (p_seen_*). The status row also carries the sums it found (r_eps, r_delta), so the
    # caller can check that the records it missed add up to them.
    return f"""CREATE OR REPLACE FUNCTION {s}.{WITHIN_V4_FUNCTION}(
    p_name text, p_known bigint, p_prefix text, p_suffix text, p_qid text,
    p_eps text, p_delta text, p_eps_limit text, p_delta_limit text, p_delta_below text,
    p_meta text, p_seen_head bigint, p_seen_hash text, p_seen_eps text, p_seen_delta text)
RETURNS TABLE (r_seq bigint, r_payload text, r_prev text, r_hash text, r_qid text,
               r_status text, r_eps text, r_delta text)
LANGUAGE plpgsql {_DEFINER} AS $fn$
DECLARE
    v_head bigint; v_last text; v_eps text; v_delta text; v_meta text; v_anchor text;
    v_bad text; v_text text; v_at integer; v_cd text; v_ce text; v_k integer;
    v_en numeric; v_ed numeric; v_dn numeric; v_dd numeric; v_n numeric; v_d numeric;
    en numeric; ed numeric; dn numeric; dd numeric; g numeric; v_scale numeric;
    ren numeric; red numeric; rdn numeric; rdd numeric;
    v_ok boolean; v_payload text; v_hash text;
BEGIN
    IF NOT pg_has_role(session_user, current_user, 'MEMBER')
       AND NOT {s}.{MAY_WRITE_FUNCTION}(ARRAY[p_name], false) THEN
        RAISE EXCEPTION 'role % may not charge dpaccount ledger % (alone)',
            session_user, p_name USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT l.head, l.last_hash, l.epsilon_sum, l.delta_sum, l.meta
      INTO v_head, v_last, v_eps, v_delta, v_meta
      FROM {s}.ledgers l WHERE l.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'dpaccount ledger % is not initialized', p_name;
    END IF;
    r_seq := v_head; r_prev := v_last; r_eps := v_eps; r_delta := v_delta;
    IF p_meta IS NOT NULL AND v_meta IS DISTINCT FROM p_meta THEN
        v_bad := 'migrated';
    ELSIF v_head < p_known THEN
        v_bad := 'behind';
    ELSE{_seen_check(s, True)}
    END IF;
    IF v_bad IS NOT NULL THEN
        r_status := v_bad;
        RETURN NEXT;
        RETURN;
    END IF;
    en := split_part(v_eps, '/', 1)::numeric * split_part(p_eps, '/', 2)::numeric
        + split_part(p_eps, '/', 1)::numeric * split_part(v_eps, '/', 2)::numeric;
    ed := split_part(v_eps, '/', 2)::numeric * split_part(p_eps, '/', 2)::numeric;
    g := gcd(en, ed); en := div(en, g); ed := div(ed, g);
    dn := split_part(v_delta, '/', 1)::numeric * split_part(p_delta, '/', 2)::numeric
        + split_part(p_delta, '/', 1)::numeric * split_part(v_delta, '/', 2)::numeric;
    dd := split_part(v_delta, '/', 2)::numeric * split_part(p_delta, '/', 2)::numeric;
    g := gcd(dn, dd); dn := div(dn, g); dd := div(dd, g);
    v_scale := trunc(2::numeric ^ {SUM_BITS});
    IF ed >= v_scale THEN
        ren := div(en * v_scale + ed - 1, ed); red := v_scale;
        g := gcd(ren, red); ren := div(ren, g); red := div(red, g);
    ELSE
        ren := en; red := ed;
    END IF;
    IF dd >= v_scale THEN
        rdn := div(dn * v_scale + dd - 1, dd); rdd := v_scale;
        g := gcd(rdn, rdd); rdn := div(rdn, g); rdd := div(rdd, g);
    ELSE
        rdn := dn; rdd := dd;
    END IF;
    v_ok := (p_eps_limit IS NULL
             OR en * split_part(p_eps_limit, '/', 2)::numeric
                <= split_part(p_eps_limit, '/', 1)::numeric * ed)
        AND dn * split_part(p_delta_limit, '/', 2)::numeric
            <= split_part(p_delta_limit, '/', 1)::numeric * dd
        AND (p_delta_below IS NULL
             OR dn * split_part(p_delta_below, '/', 2)::numeric
                < split_part(p_delta_below, '/', 1)::numeric * dd);
    IF v_head > p_known THEN
        RETURN QUERY SELECT r.seq, r.payload, r.prev_hash, r.hash, r.query_id, NULL::text,
            NULL::text, NULL::text
            FROM {s}.records r
            WHERE r.ledger = p_name AND r.seq >= greatest(p_known - 1, 0) AND r.seq < v_head
            ORDER BY r.seq;
    END IF;
    IF NOT v_ok THEN
        r_status := 'refused';
        RETURN NEXT;
        RETURN;
    END IF;
    v_payload := p_prefix || v_head::text || p_suffix;
    v_hash := encode(sha256(convert_to(v_last || E'\\n' || v_payload, 'UTF8')), 'hex');
    INSERT INTO {s}.records VALUES (p_name, v_head, v_payload, v_last, v_hash, p_qid);
    UPDATE {s}.ledgers SET head = v_head + 1, last_hash = v_hash,
        epsilon_sum = ren::text || '/' || red::text, delta_sum = rdn::text || '/' || rdd::text
        WHERE name = p_name;
    r_hash := v_hash; r_status := 'appended';
    RETURN NEXT;
END
$fn$"""


def _append_one_sql(s: str) -> str:
    # Compare-and-append of one record in one statement: the ledger row is updated only
    # if it holds exactly the tip the caller expects (head, last hash, sums) and its
    # settings (p_meta, NULL: not checked), and the record is inserted from the updated
    # row. Otherwise nothing is written, and the row (read again, in a new snapshot)
    # says why: 'migrated', 'behind', 'conflict' (others appended, the chain still
    # passes through p_prev), 'diverged' or 'tampered'.
    return f"""CREATE OR REPLACE FUNCTION {s}.{APPEND_ONE_FUNCTION}(
    p_name text, p_head bigint, p_prev text, p_eps text, p_delta text, p_meta text,
    p_payload text, p_hash text, p_qid text, p_new_eps text, p_new_delta text)
RETURNS text LANGUAGE plpgsql {_DEFINER} AS $fn$
DECLARE
    v_head bigint; v_last text; v_eps text; v_delta text; v_meta text; v_anchor text;
BEGIN
    IF NOT pg_has_role(session_user, current_user, 'MEMBER')
       AND NOT {s}.{MAY_WRITE_FUNCTION}(ARRAY[p_name], false) THEN
        RAISE EXCEPTION 'role % may not charge dpaccount ledger % (alone)',
            session_user, p_name USING ERRCODE = 'insufficient_privilege';
    END IF;
    WITH u AS (
        UPDATE {s}.ledgers SET head = p_head + 1, last_hash = p_hash,
            epsilon_sum = p_new_eps, delta_sum = p_new_delta
        WHERE name = p_name AND head = p_head AND last_hash = p_prev
          AND epsilon_sum = p_eps AND delta_sum = p_delta
          AND (p_meta IS NULL OR meta = p_meta)
        RETURNING name)
    INSERT INTO {s}.records SELECT u.name, p_head, p_payload, p_prev, p_hash, p_qid FROM u;
    IF FOUND THEN
        RETURN 'appended';
    END IF;
    SELECT l.head, l.last_hash, l.epsilon_sum, l.delta_sum, l.meta
      INTO v_head, v_last, v_eps, v_delta, v_meta
      FROM {s}.ledgers l WHERE l.name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'dpaccount ledger % is not initialized', p_name;
    ELSIF p_meta IS NOT NULL AND v_meta IS DISTINCT FROM p_meta THEN
        RETURN 'migrated';
    ELSIF v_head < p_head THEN
        RETURN 'behind';
    ELSIF v_head > p_head THEN
        IF p_head = 0 THEN
            RETURN 'conflict';
        END IF;
        SELECT r.hash INTO v_anchor FROM {s}.records r
            WHERE r.ledger = p_name AND r.seq = p_head - 1;
        RETURN CASE WHEN v_anchor IS DISTINCT FROM p_prev THEN 'diverged'
                    ELSE 'conflict' END;
    ELSIF v_last IS DISTINCT FROM p_prev THEN
        RETURN 'diverged';
    ELSIF v_eps IS DISTINCT FROM p_eps OR v_delta IS DISTINCT FROM p_delta THEN
        RETURN 'tampered';
    END IF;
    RETURN 'conflict';
END
$fn$"""


def _append_at_sql(s: str) -> str:
    # Compare-and-append, all or none: ledger i (rows locked in name order) must have
    # exactly the tip the caller gives (p_heads, p_prevs, p_epss, p_deltas: the tip the
    # caller saw last or read under the lock) and its settings (p_metas, NULL: not
    # checked); then each record is stored at that head and the tip moved to
    # (p_hashes, p_new_epss, p_new_deltas) (the sums trigger checks at commit that they
    # add the record's cost). Statuses: 'appended' for all, or, writing nothing,
    # 'ok' and, for the ledgers that differ, 'conflict' (others appended; the chain
    # still passes through p_prevs), 'migrated', 'behind', 'diverged' or 'tampered'.
    return f"""CREATE OR REPLACE FUNCTION {s}.{APPEND_AT_FUNCTION}(
    p_names text[], p_heads bigint[], p_prevs text[], p_epss text[], p_deltas text[],
    p_metas text[], p_payloads text[], p_hashes text[], p_qids text[],
    p_new_epss text[], p_new_deltas text[])
RETURNS TABLE (r_name text, r_status text)
LANGUAGE plpgsql {_DEFINER} AS $fn$
DECLARE
    i integer; v_status text[]; v_all_ok boolean := true; v_anchor text;
    v_head bigint; v_last text; v_eps text; v_delta text; v_meta text;
BEGIN
    IF NOT pg_has_role(session_user, current_user, 'MEMBER')
       AND NOT {s}.{MAY_WRITE_FUNCTION}(p_names, false) THEN
        RAISE EXCEPTION 'role % may not charge dpaccount ledgers % (alone or together)',
            session_user, p_names USING ERRCODE = 'insufficient_privilege';
    END IF;
    v_status := array_fill(NULL::text, ARRAY[cardinality(p_names)]);
    FOREACH i IN ARRAY {s}.{ORDER_FUNCTION}(p_names) LOOP
        SELECT l.head, l.last_hash, l.epsilon_sum, l.delta_sum, l.meta
          INTO v_head, v_last, v_eps, v_delta, v_meta
          FROM {s}.ledgers l WHERE l.name = p_names[i] FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'dpaccount ledger % is not initialized', p_names[i];
        END IF;
        IF p_metas[i] IS NOT NULL AND v_meta IS DISTINCT FROM p_metas[i] THEN
            v_status[i] := 'migrated';
        ELSIF v_head < p_heads[i] THEN
            v_status[i] := 'behind';
        ELSIF v_head > p_heads[i] THEN
            IF p_heads[i] = 0 THEN
                v_anchor := '{GENESIS_HASH}';
            ELSE
                SELECT r.hash INTO v_anchor FROM {s}.records r
                    WHERE r.ledger = p_names[i] AND r.seq = p_heads[i] - 1;
            END IF;
            v_status[i] := CASE WHEN v_anchor IS DISTINCT FROM p_prevs[i] THEN 'diverged'
                                ELSE 'conflict' END;
        ELSIF v_last IS DISTINCT FROM p_prevs[i] THEN
            v_status[i] := 'diverged';
        ELSIF v_eps IS DISTINCT FROM p_epss[i] OR v_delta IS DISTINCT FROM p_deltas[i] THEN
            v_status[i] := 'tampered';
        ELSE
            v_status[i] := 'ok';
        END IF;
        v_all_ok := v_all_ok AND v_status[i] = 'ok';
    END LOOP;
    IF v_all_ok THEN
        FOR i IN 1 .. cardinality(p_names) LOOP
            INSERT INTO {s}.records VALUES (p_names[i], p_heads[i], p_payloads[i],
                p_prevs[i], p_hashes[i], p_qids[i]);
            UPDATE {s}.ledgers SET head = p_heads[i] + 1, last_hash = p_hashes[i],
                epsilon_sum = p_new_epss[i], delta_sum = p_new_deltas[i]
                WHERE name = p_names[i];
            v_status[i] := 'appended';
        END LOOP;
    END IF;
    FOR i IN 1 .. cardinality(p_names) LOOP
        r_name := p_names[i]; r_status := v_status[i];
        RETURN NEXT;
    END LOOP;
END
$fn$"""


def _lock_sql(s: str) -> str:
    # Lock the rows of p_names (in name order) for the rest of the transaction and
    # return, for each, its tip (r_meta not NULL: head in r_seq, last hash in r_hash,
    # sums, settings) followed by its records from p_starts[i] - 1 on.
    return f"""CREATE OR REPLACE FUNCTION {s}.{LOCK_FUNCTION}(p_names text[], p_starts bigint[])
RETURNS TABLE (r_name text, r_seq bigint, r_payload text, r_prev text, r_hash text,
               r_qid text, r_eps text, r_delta text, r_meta text)
LANGUAGE plpgsql {_DEFINER} AS $fn$
DECLARE
    i integer; v_head bigint;
BEGIN
    IF NOT pg_has_role(session_user, current_user, 'MEMBER')
       AND NOT {s}.{MAY_WRITE_FUNCTION}(p_names, false) THEN
        RAISE EXCEPTION 'role % may not charge dpaccount ledgers % (alone or together)',
            session_user, p_names USING ERRCODE = 'insufficient_privilege';
    END IF;
    FOREACH i IN ARRAY {s}.{ORDER_FUNCTION}(p_names) LOOP
        SELECT p_names[i], l.head, NULL, NULL, l.last_hash, NULL, l.epsilon_sum,
               l.delta_sum, l.meta
          INTO r_name, r_seq, r_payload, r_prev, r_hash, r_qid, r_eps, r_delta, r_meta
          FROM {s}.ledgers l WHERE l.name = p_names[i] FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'dpaccount ledger % is not initialized', p_names[i];
        END IF;
        v_head := r_seq;
        RETURN NEXT;
        RETURN QUERY SELECT p_names[i], r.seq, r.payload, r.prev_hash, r.hash, r.query_id,
            NULL::text, NULL::text, NULL::text
            FROM {s}.records r
            WHERE r.ledger = p_names[i] AND r.seq >= greatest(p_starts[i] - 1, 0)
              AND r.seq < v_head ORDER BY r.seq;
    END LOOP;
END
$fn$"""


def _snapshot_sql(s: str) -> str:
    # Store a snapshot of ledger p_name at the tip the writer saw last (p_seen_*), if
    # that is still exactly its tip and its settings are p_meta: 'written' or 'exists';
    # else nothing is written and the status says why ('moved', 'refused' for a role
    # without a write grant on it, 'migrated', 'behind', 'tampered' or 'diverged').
    return f"""CREATE OR REPLACE FUNCTION {s}.{SNAPSHOT_FUNCTION}(
    p_name text, p_seen_head bigint, p_seen_hash text, p_seen_eps text, p_seen_delta text,
    p_meta text, p_settings text, p_state text, p_link text)
RETURNS text LANGUAGE plpgsql {_DEFINER} AS $fn$
DECLARE
    v_head bigint; v_last text; v_eps text; v_delta text; v_meta text; v_anchor text;
    v_bad text;
BEGIN
    IF NOT pg_has_role(session_user, current_user, 'MEMBER')
       AND NOT {s}.{MAY_WRITE_FUNCTION}(ARRAY[p_name], true) THEN
        RETURN 'refused';
    END IF;
    SELECT l.head, l.last_hash, l.epsilon_sum, l.delta_sum, l.meta
      INTO v_head, v_last, v_eps, v_delta, v_meta
      FROM {s}.ledgers l WHERE l.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'dpaccount ledger % is not initialized', p_name;
    END IF;
    IF p_meta IS NOT NULL AND v_meta IS DISTINCT FROM p_meta THEN
        RETURN 'migrated';
    END IF;{_seen_check(s, False)}
    IF v_bad IS NOT NULL THEN
        RETURN v_bad;
    END IF;
    IF v_head <> p_seen_head THEN
        RETURN 'moved';
    END IF;
    INSERT INTO {s}.snapshots VALUES (p_name, v_head, v_last, v_eps, v_delta, p_settings,
        p_state, p_link) ON CONFLICT DO NOTHING;
    RETURN CASE WHEN FOUND THEN 'written' ELSE 'exists' END;
END
$fn$"""
