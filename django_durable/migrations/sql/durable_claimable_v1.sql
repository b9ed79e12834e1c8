-- durable_claimable_v1: the rule of a claimable run (models.CLAIMABLE_STATUSES, with a
-- due time; due when that time has come), written once for durable_claim_v5. An SQL
-- function PostgreSQL inlines: the claim's statements read as if the condition were
-- written in them, so they still match the partial indexes' conditions.
-- Created by 0.3.0's migration (0001_0_3_initial).
CREATE OR REPLACE FUNCTION durable_claimable_v1(p_status varchar, p_due_at timestamptz)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $claimable$ SELECT p_status IN ('pending', 'waiting', 'compensating') AND p_due_at IS NOT NULL $claimable$;
