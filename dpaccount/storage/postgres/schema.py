"""The tables, triggers and server-side functions of a PostgreSQL ledger schema.

Every statement is idempotent (``IF NOT EXISTS``, ``CREATE OR REPLACE``). The functions'
sources are pinned: `PostgresStore.check_functions` compares what the server holds with
`function_sources`, so a replaced function is refused. A function's name carries a
version: a changed body gets a new name, created next to the old one.
"""

from __future__ import annotations

from dpaccount.storage._sql import SUM_BITS
from dpaccount.storage.postgres.functions import (
    ADD_FUNCTION,
    CMP_FUNCTION,
    MAY_WRITE_FUNCTION,
    ORDER_FUNCTION,
    SIGNATURES,
    definer_sql,
)

__all__ = [
    "ADD_FUNCTION",
    "SUMS_FUNCTION",
    "TABLES",
    "TIP_FUNCTION",
    "TRIGGERS",
    "WITHIN_FUNCTION",
    "WITHIN_SIGNATURE",
    "append_within_sql",
    "function_sources",
    "present_sql",
    "schema_sql",
]

#: The tables whose triggers protect a ledger (and whose rows a granted role may read).
TABLES = ("ledgers", "records", "meta_history", "snapshots")


def schema_sql(schema: str) -> list[str]:
    s = f'"{schema}"'
    refuse = (
        f"CREATE OR REPLACE FUNCTION {s}.dpaccount_append_only() RETURNS trigger "
        "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION "
        "'dpaccount % is append-only', TG_TABLE_NAME; END $$"
    )
    statements = [
        f"CREATE SCHEMA IF NOT EXISTS {s}",
        f"""CREATE TABLE IF NOT EXISTS {s}.ledgers (
            name text PRIMARY KEY,
            meta text NOT NULL,
            schema_version integer NOT NULL,
            head bigint NOT NULL CHECK (head >= 0),
            epsilon_sum text NOT NULL,
            delta_sum text NOT NULL,
            last_hash text NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS {s}.records (
            ledger text NOT NULL REFERENCES {s}.ledgers (name),
            seq bigint NOT NULL CHECK (seq >= 0),
            payload text NOT NULL,
            prev_hash text NOT NULL,
            hash text NOT NULL,
            query_id text,
            PRIMARY KEY (ledger, seq),
            UNIQUE (ledger, query_id))""",
        f"""CREATE TABLE IF NOT EXISTS {s}.meta_history (
            ledger text NOT NULL REFERENCES {s}.ledgers (name),
            version integer NOT NULL CHECK (version >= 0),
            at text NOT NULL,
            head bigint NOT NULL,
            meta text NOT NULL,
            prev_hash text NOT NULL,
            hash text NOT NULL,
            PRIMARY KEY (ledger, version))""",
        f"""CREATE TABLE IF NOT EXISTS {s}.snapshots (
            ledger text NOT NULL REFERENCES {s}.ledgers (name),
            head bigint NOT NULL CHECK (head > 0),
            last_hash text NOT NULL,
            epsilon_sum text NOT NULL,
            delta_sum text NOT NULL,
            settings text NOT NULL,
            state text,
            hash text NOT NULL,
            PRIMARY KEY (ledger, head))""",
        refuse,
    ]
    for table in ("records", "meta_history", "snapshots"):
        statements.append(
            f"CREATE OR REPLACE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE "
            f"ON {s}.{table} FOR EACH ROW EXECUTE FUNCTION {s}.dpaccount_append_only()"
        )
        statements.append(
            f"CREATE OR REPLACE TRIGGER {table}_no_truncate BEFORE TRUNCATE "
            f"ON {s}.{table} FOR EACH STATEMENT EXECUTE FUNCTION {s}.dpaccount_append_only()"
        )
    statements.append(
        f"CREATE OR REPLACE TRIGGER ledgers_keep BEFORE DELETE ON {s}.ledgers "
        f"FOR EACH ROW EXECUTE FUNCTION {s}.dpaccount_append_only()"
    )
    # The cached tip only moves forward, one record at a time: resetting the cached sums
    # (to admit more charges) is refused by the database.
    statements.append(
        f"""CREATE OR REPLACE FUNCTION {s}.{TIP_FUNCTION}() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.head NOT IN (OLD.head, OLD.head + 1) OR (NEW.head = OLD.head AND (
                NEW.epsilon_sum IS DISTINCT FROM OLD.epsilon_sum
                OR NEW.delta_sum IS DISTINCT FROM OLD.delta_sum
                OR NEW.last_hash IS DISTINCT FROM OLD.last_hash)) THEN
                RAISE EXCEPTION 'dpaccount ledger tips only move forward to a recorded hash';
            END IF;
            RETURN NEW;
        END $$"""
    )
    statements.append(
        f"CREATE OR REPLACE TRIGGER ledgers_tip_moves_forward BEFORE UPDATE ON {s}.ledgers "
        f"FOR EACH ROW EXECUTE FUNCTION {s}.{TIP_FUNCTION}()"
    )
    # ... and when it moves forward by one record, to that record's hash with that
    # record's cost added to the sums (checked at commit, when the record is there).
    statements.append(
        f"""CREATE OR REPLACE FUNCTION {s}.{ADD_FUNCTION}(a text, b text) RETURNS text
        LANGUAGE plpgsql IMMUTABLE AS $$
        DECLARE
            an numeric := split_part(a, '/', 1)::numeric;
            ad numeric := coalesce(nullif(split_part(a, '/', 2), ''), '1')::numeric;
            bn numeric := split_part(b, '/', 1)::numeric;
            bd numeric := coalesce(nullif(split_part(b, '/', 2), ''), '1')::numeric;
            n numeric; d numeric; g numeric;
            v_scale numeric := trunc(2::numeric ^ {SUM_BITS});
        BEGIN
            n := an * bd + bn * ad; d := ad * bd;
            g := gcd(n, d); n := div(n, g); d := div(d, g);
            IF d >= v_scale THEN
                n := div(n * v_scale + d - 1, d); d := v_scale;
                g := gcd(n, d); n := div(n, g); d := div(d, g);
            END IF;
            RETURN n::text || '/' || d::text;
        END $$"""
    )
    statements.append(
        f"""CREATE OR REPLACE FUNCTION {s}.{SUMS_FUNCTION}() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
            v_text text; v_at integer; v_delta text; v_eps text; v_meta jsonb;
            v_budget text; v_size numeric;
        BEGIN
            IF NEW.head = OLD.head THEN
                RETURN NULL;
            END IF;
            -- The canonical payload's top-level cost (sorted keys: delta, then epsilon):
            -- the first '"cost":{{' is it, since no charge has a key named cost and a
            -- quote inside a JSON string is always escaped. Found with strpos: an
            -- unanchored regular expression here cost about 100 us a charge. (Parsing
            -- the payload as json would fail on an escaped NUL.)
            SELECT r.payload INTO v_text FROM {s}.records r
                WHERE r.ledger = NEW.name AND r.seq = OLD.head AND r.hash = NEW.last_hash;
            v_at := strpos(v_text, '"cost":{{"delta":"');
            IF v_at > 0 THEN
                v_text := substr(v_text, v_at + 17);
                v_delta := split_part(v_text, '"', 1);
                v_text := substr(v_text, length(v_delta) + 1);
                IF left(v_text, 13) = '","epsilon":"' THEN
                    v_eps := split_part(substr(v_text, 14), '"', 1);
                END IF;
            END IF;
            IF v_eps IS NULL OR v_delta !~ '^-?[0-9]+(/[0-9]+)?$'
                OR v_eps !~ '^-?[0-9]+(/[0-9]+)?$'
                OR NEW.epsilon_sum IS DISTINCT FROM {s}.{ADD_FUNCTION}(OLD.epsilon_sum, v_eps)
                OR NEW.delta_sum IS DISTINCT FROM {s}.{ADD_FUNCTION}(OLD.delta_sum, v_delta)
            THEN
                RAISE EXCEPTION 'dpaccount ledger tips only move forward to a recorded '
                    'hash, adding that record''s cost';
            END IF;
            -- The basic rule's budget, enforced by the database on every path that moves
            -- a tip (whatever limits a caller of the writer functions passed): the
            -- stored sums (exact, or rounded up past 2^-{SUM_BITS}) stay within the
            -- stored budget, and delta strictly below 1/n when a size is declared.
            v_meta := NEW.meta::jsonb;
            IF v_meta->'rule'->>'name' = 'basic' THEN
                v_budget := v_meta->>'budget_epsilon';
                IF v_budget IS NOT NULL AND
                    split_part(NEW.epsilon_sum, '/', 1)::numeric
                        * coalesce(nullif(split_part(v_budget, '/', 2), ''), '1')::numeric
                    > split_part(v_budget, '/', 1)::numeric
                        * coalesce(nullif(split_part(NEW.epsilon_sum, '/', 2), ''), '1')::numeric
                THEN
                    RAISE EXCEPTION 'dpaccount ledger % would spend past its stored epsilon '
                        'budget', NEW.name USING ERRCODE = 'check_violation';
                END IF;
                v_budget := v_meta->>'budget_delta';
                v_size := (v_meta->>'dataset_size')::numeric;
                IF split_part(NEW.delta_sum, '/', 1)::numeric
                        * coalesce(nullif(split_part(v_budget, '/', 2), ''), '1')::numeric
                    > split_part(v_budget, '/', 1)::numeric
                        * coalesce(nullif(split_part(NEW.delta_sum, '/', 2), ''), '1')::numeric
                    OR (v_size IS NOT NULL AND
                        split_part(NEW.delta_sum, '/', 1)::numeric * v_size
                        >= coalesce(nullif(split_part(NEW.delta_sum, '/', 2), ''), '1')::numeric)
                THEN
                    RAISE EXCEPTION 'dpaccount ledger % would spend past its stored delta '
                        'budget', NEW.name USING ERRCODE = 'check_violation';
                END IF;
            END IF;
            RETURN NULL;
        END $$"""
    )
    # (Constraint triggers have no CREATE OR REPLACE.) A schema made by an earlier
    # dpaccount has the trigger on an older version of the function: it is re-created on
    # this one.
    statements.append(
        f"""DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
                       WHERE t.tgname = 'ledgers_sums_follow_records'
                       AND t.tgrelid = '{s}.ledgers'::regclass
                       AND p.proname = '{SUMS_FUNCTION}') THEN
            DROP TRIGGER IF EXISTS ledgers_sums_follow_records ON {s}.ledgers;
            CREATE CONSTRAINT TRIGGER ledgers_sums_follow_records AFTER UPDATE
            ON {s}.ledgers DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
            EXECUTE FUNCTION {s}.{SUMS_FUNCTION}();
        END IF;
        END $$"""
    )
    statements.append(append_within_sql(s))
    statements += _grants_sql(s)
    return statements


def _grants_sql(s: str) -> list[str]:
    """Least privilege (see `dpaccount.storage.postgres.roles`): the grants table, the
    writer functions (``EXECUTE`` revoked from ``PUBLIC``), and row-level security that
    shows a granted role only the ledgers it was granted (the owner sees everything)."""
    statements = [
        f"""CREATE TABLE IF NOT EXISTS {s}.grants (
            role oid NOT NULL,
            ledger text NOT NULL,
            access text NOT NULL CHECK (access IN ('write', 'read', 'audit')),
            via text NOT NULL,
            needs text[] NOT NULL DEFAULT '{{}}',
            PRIMARY KEY (role, ledger, via))""",
        *definer_sql(s),
    ]
    for name in (*SIGNATURES, MAY_WRITE_FUNCTION, CMP_FUNCTION, ORDER_FUNCTION):
        statements.append(f"REVOKE EXECUTE ON FUNCTION {s}.{name} FROM PUBLIC")
    granted = (f"ARRAY(SELECT g.ledger FROM {s}.grants g "
               "WHERE pg_catalog.pg_has_role(current_user, g.role, 'MEMBER'))")
    for table, column in (("ledgers", "name"), ("records", "ledger"),
                          ("meta_history", "ledger"), ("snapshots", "ledger"),
                          ("grants", None)):
        using = ("pg_catalog.pg_has_role(current_user, role, 'MEMBER')" if column is None
                 else f"{column} = ANY ({granted})")
        statements.append(f"ALTER TABLE {s}.{table} ENABLE ROW LEVEL SECURITY")
        statements.append(
            f"""DO $$ BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_policy
                           WHERE polrelid = '{s}.{table}'::regclass
                           AND polname = 'dpaccount_granted') THEN
                CREATE POLICY dpaccount_granted ON {s}.{table} FOR SELECT USING ({using});
            END IF;
            END $$"""
        )
    return statements


def present_sql(s: str) -> tuple[str, tuple[str, ...]]:
    """A query (and its parameters) that is true when schema ``s`` holds every table and
    function this version of dpaccount needs."""
    names = [f"{s}.meta_history", f"{s}.snapshots", f"{s}.grants"]
    functions = [f"{s}.{WITHIN_SIGNATURE}", f"{s}.{TIP_FUNCTION}()", f"{s}.{SUMS_FUNCTION}()",
                 f"{s}.{MAY_WRITE_FUNCTION}(text[], boolean)", f"{s}.{CMP_FUNCTION}(text, text)",
                 f"{s}.{ORDER_FUNCTION}(text[])",
                 *(f"{s}.{name}({args})" for name, args in SIGNATURES.items())]
    checks = (["to_regclass(%s) IS NOT NULL"] * len(names)
              + ["to_regprocedure(%s) IS NOT NULL"] * len(functions))
    return "SELECT " + " AND ".join(checks), (*names, *functions)


#: The trigger function that keeps a ledger's cached tip moving forward only.
TIP_FUNCTION = "dpaccount_tip_moves_forward_v1"
#: The deferred trigger function that checks a tip moved by one record adds its cost,
#: and the bounded exact addition of two ``"num/den"`` texts it uses.
SUMS_FUNCTION = "dpaccount_sums_follow_records_v3"

#: The server-side function behind `PostgresStore.append_within()` (its signature;
#: the name carries a version so a changed body gets a new function).
WITHIN_FUNCTION = "dpaccount_append_within_v3"
WITHIN_SIGNATURE = f"{WITHIN_FUNCTION}(text, bigint, text, text, text, text, text, text, " \
    "text, text, text, text)"


#: The protective triggers: name -> (the table it is on, the function it calls).
TRIGGERS = {
    **{f"{table}_{kind}": (table, "dpaccount_append_only")
       for table in ("records", "meta_history", "snapshots")
       for kind in ("append_only", "no_truncate")},
    "ledgers_keep": ("ledgers", "dpaccount_append_only"),
    "ledgers_tip_moves_forward": ("ledgers", TIP_FUNCTION),
    "ledgers_sums_follow_records": ("ledgers", SUMS_FUNCTION),
}


def function_sources(schema: str) -> dict[str, str]:
    """name -> the body (pg_proc.prosrc) of every function dpaccount installs in ``schema``."""
    sources: dict[str, str] = {}
    for statement in schema_sql(schema):
        if "CREATE OR REPLACE FUNCTION" not in statement:
            continue
        name = statement.split("FUNCTION", 1)[1].split("(", 1)[0].split(".")[-1].strip()
        for quote in ("$fn$", "$$"):
            if quote in statement:
                sources[name] = statement.split(quote)[1]
                break
    return sources


def append_within_sql(s: str) -> str:
    """The PL/pgSQL function that decides and appends at the head it finds.

    Arguments: ledger name, the caller's known head, the hash the caller believes
    record ``known - 1`` has (NULL: unknown; if it differs, nothing is appended and the
    status is ``'diverged'``), the record's canonical payload
    split around its seq (prefix, suffix), its query_id, its cost's epsilon and delta,
    and the limits (``"num/den"`` text; a NULL epsilon limit or delta bound is absent).
    Under the ledger row's lock it adds the cost to the cached exact sums
    (``a/b + c/d = (ad + cb)/(bd)``, reduced by their gcd, as Python's Fraction does),
    compares them with the limits by cross-multiplication, and if they fit stores the
    sums (rounded up as `bounded_sum` rounds them where their denominators exceed
    ``2**SUM_BITS``) and the
    payload numbered with the head and hashed like ``chain_hash_payload``. It returns
    the records from ``known - 1`` (the anchor of the chain) to the head it found when
    the caller missed any (else none), then one status row: (head, NULL, the last hash
    before ours, our hash or NULL, NULL, and ``'appended'``, ``'refused'``, ``'behind'``
    or ``'diverged'``).
    """
    return f"""
CREATE OR REPLACE FUNCTION {s}.{WITHIN_FUNCTION}(
    p_name text, p_known bigint, p_anchor text, p_prefix text, p_suffix text, p_qid text,
    p_eps text, p_delta text, p_eps_limit text, p_delta_limit text, p_delta_below text,
    p_meta text)
RETURNS TABLE (r_seq bigint, r_payload text, r_prev text, r_hash text, r_qid text,
               r_status text)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_head bigint; v_last text; v_eps text; v_delta text;
    en numeric; ed numeric; dn numeric; dd numeric; g numeric; v_scale numeric;
    ren numeric; red numeric; rdn numeric; rdd numeric;
    v_ok boolean; v_payload text; v_hash text; v_anchor text; v_meta text;
BEGIN
    SELECT l.head, l.last_hash, l.epsilon_sum, l.delta_sum, l.meta
      INTO v_head, v_last, v_eps, v_delta, v_meta
      FROM {s}.ledgers l WHERE l.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'dpaccount ledger % is not initialized', p_name;
    END IF;
    IF p_meta IS NOT NULL AND v_meta IS DISTINCT FROM p_meta THEN
        r_seq := v_head; r_prev := v_last; r_status := 'migrated';
        RETURN NEXT;
        RETURN;
    END IF;
    IF v_head < p_known THEN
        r_seq := v_head; r_prev := v_last; r_status := 'behind';
        RETURN NEXT;
        RETURN;
    END IF;
    IF p_anchor IS NOT NULL THEN
        IF v_head = p_known THEN
            v_anchor := v_last;
        ELSE
            SELECT r.hash INTO v_anchor FROM {s}.records r
                WHERE r.ledger = p_name AND r.seq = p_known - 1;
        END IF;
        IF v_anchor IS DISTINCT FROM p_anchor THEN
            r_seq := v_head; r_prev := v_last; r_status := 'diverged';
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    en := split_part(v_eps, '/', 1)::numeric * split_part(p_eps, '/', 2)::numeric
        + split_part(p_eps, '/', 1)::numeric * split_part(v_eps, '/', 2)::numeric;
    ed := split_part(v_eps, '/', 2)::numeric * split_part(p_eps, '/', 2)::numeric;
    g := gcd(en, ed); en := div(en, g); ed := div(ed, g);
    dn := split_part(v_delta, '/', 1)::numeric * split_part(p_delta, '/', 2)::numeric
        + split_part(p_delta, '/', 1)::numeric * split_part(v_delta, '/', 2)::numeric;
    dd := split_part(v_delta, '/', 2)::numeric * split_part(p_delta, '/', 2)::numeric;
    g := gcd(dn, dd); dn := div(dn, g); dd := div(dd, g);
    -- Stored sums keep denominators below 2^{SUM_BITS}: bigger ones are rounded up to a
    -- multiple of 2^-{SUM_BITS} (as _sql.bounded_sum does); limits see the exact sums.
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
        RETURN QUERY SELECT r.seq, r.payload, r.prev_hash, r.hash, r.query_id, NULL::text
            FROM {s}.records r
            WHERE r.ledger = p_name AND r.seq >= greatest(p_known - 1, 0) AND r.seq < v_head
            ORDER BY r.seq;
    END IF;
    IF NOT v_ok THEN
        r_seq := v_head; r_prev := v_last; r_status := 'refused';
        RETURN NEXT;
        RETURN;
    END IF;
    v_payload := p_prefix || v_head::text || p_suffix;
    v_hash := encode(sha256(convert_to(v_last || E'\\n' || v_payload, 'UTF8')), 'hex');
    INSERT INTO {s}.records VALUES (p_name, v_head, v_payload, v_last, v_hash, p_qid);
    UPDATE {s}.ledgers SET head = v_head + 1, last_hash = v_hash,
        epsilon_sum = ren::text || '/' || red::text, delta_sum = rdn::text || '/' || rdd::text
        WHERE name = p_name;
    r_seq := v_head; r_prev := v_last; r_hash := v_hash; r_status := 'appended';
    RETURN NEXT;
END
$fn$"""
