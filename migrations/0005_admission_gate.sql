-- 0005_admission_gate — the admission decision of a budgeted claim inside the claim statement
-- (SPEC §4 R-ADMIT, R-NEVER, R-CHARGE; §10 R-PERF).
--
-- Called once per locked candidate by the budgeted claim statements, after the candidate's row
-- lock and before the claim tail; the claim happens only when refusal is NULL. It locks the
-- queue's policy row, checks that the window the caller placed in Python (windows.py) is still
-- the policy's window and contains p_now, counts in-flight, and charges the window counter.
--
-- Why a VOLATILE PL/pgSQL function: under READ COMMITTED the claim statement's snapshot was
-- taken before it waited for the policy lock, so counts read by that statement would miss the
-- claim that the previous lock holder committed while we waited. A VOLATILE function takes a
-- fresh snapshot for each statement it runs (SPI, not read-only), so the count below — which
-- runs after the lock is granted, and the lock is released only after the holder's commit is
-- visible — sees every claim committed by earlier holders. Every budgeted claim of the queue
-- holds this lock from its count to its commit, so admissions of one queue are serialized and
-- each sees its predecessors. REPEATABLE READ or SERIALIZABLE would pin one snapshot: the claim
-- paths run in READ COMMITTED (the default), and the function refuses otherwise.
--
-- The window counter is charged by a conditional upsert: ON CONFLICT DO UPDATE locks and checks
-- the newest version of the counter row whatever the snapshot, so the window limit holds even
-- without the policy lock; the lock is what makes the in-flight count exact.
--
-- Refusals: 'policy_changed' (the caller assumed another window definition, or no policy),
-- 'window_moved' (p_now is not inside the window the caller placed: its clock was on the other
-- side of a boundary), 'paused', 'in_flight_full', 'window_exhausted'. The caller retries the
-- first two after re-reading the policies with the database clock; nothing is written then.
CREATE FUNCTION admission_gate(
    p_endpoint_id uuid, p_queue text, p_todo_id uuid, p_now timestamptz,
    -- One row per queue the caller assumes budgeted: queue, window period, tz, start, weekday,
    -- window start, window end (text; the instants ISO 8601 with offset; NULL: no window).
    p_budgets text[],
    OUT gate_queue text, OUT gate_now timestamptz, OUT refusal text, OUT budgeted boolean,
    OUT checked_window timestamptz, OUT checked_window_end timestamptz,
    OUT in_flight bigint, OUT used_before int, OUT used_after int,
    OUT current_max_in_flight int, OUT current_max_claims int,
    OUT earliest_lease_expiry timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    pol admission_policies;
    i int;
BEGIN
    gate_queue := p_queue;
    gate_now := p_now;
    budgeted := false;
    SELECT * INTO pol FROM admission_policies p
    WHERE p.endpoint_id = p_endpoint_id AND p.queue = p_queue
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;  -- no policy: today's claim, nothing to charge
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'admission_gate needs READ COMMITTED (fresh snapshot after the lock)';
    END IF;
    budgeted := true;
    current_max_in_flight := pol.max_in_flight;
    current_max_claims := pol.max_claims_per_window;
    FOR j IN 1 .. coalesce(array_length(p_budgets, 1), 0) LOOP
        IF p_budgets[j][1] = p_queue THEN
            i := j;
            EXIT;
        END IF;
    END LOOP;
    IF i IS NULL OR (pol.window_period, pol.window_tz, pol.window_start, pol.window_weekday)
            IS DISTINCT FROM (p_budgets[i][2], p_budgets[i][3], p_budgets[i][4], p_budgets[i][5])
    THEN
        refusal := 'policy_changed';
        RETURN;
    END IF;
    IF pol.window_period IS NOT NULL THEN
        checked_window := p_budgets[i][6]::timestamptz;
        checked_window_end := p_budgets[i][7]::timestamptz;
        IF NOT coalesce(p_now >= checked_window AND p_now < checked_window_end, false) THEN
            refusal := 'window_moved';
            RETURN;
        END IF;
    END IF;
    IF pol.max_in_flight = 0 OR pol.max_claims_per_window = 0 THEN
        refusal := 'paused';
        RETURN;
    END IF;
    -- From here on every statement reads a snapshot taken after the lock was granted.
    IF pol.max_in_flight IS NOT NULL THEN
        -- The candidate itself is excluded: a takeover replaces its own lapsed claim.
        SELECT count(*) INTO in_flight FROM todos t
        WHERE t.endpoint_id = p_endpoint_id AND t.queue = p_queue AND t.state = 'claimed'
          AND t.id <> p_todo_id;
        IF in_flight >= pol.max_in_flight THEN
            refusal := 'in_flight_full';
            SELECT min(t.lease_expires_at) INTO earliest_lease_expiry FROM todos t
            WHERE t.endpoint_id = p_endpoint_id AND t.queue = p_queue AND t.state = 'claimed';
        END IF;
    END IF;
    IF pol.max_claims_per_window IS NULL THEN
        RETURN;
    END IF;
    IF refusal IS NULL THEN
        INSERT INTO admission_windows AS w (policy_id, window_start, used, updated_at)
        VALUES (pol.id, checked_window, 1, p_now)
        ON CONFLICT (policy_id, window_start) DO UPDATE
            SET used = w.used + 1, updated_at = excluded.updated_at
            WHERE w.used < pol.max_claims_per_window
        RETURNING w.used INTO used_after;
        IF FOUND THEN
            used_before := used_after - 1;
            RETURN;
        END IF;
    END IF;
    SELECT coalesce(max(w.used), 0) INTO used_before FROM admission_windows w
    WHERE w.policy_id = pol.id AND w.window_start = checked_window;
    IF refusal IS NULL THEN
        refusal := 'window_exhausted';
    END IF;
END
$$;
