-- The first trace of each transfer (docs/adr/0018-traces.md): the W3C traceparent of the span that
-- appended its `TransferCreated`, written by the same statement as that event (so a transfer that
-- exists has its row, and a creation that failed has none), and only when the ledger exports
-- traces. A recovery attempt links its own span to it; the console's timeline shows its trace id.
-- Beside the event log, never in it: events are the immutable leaves of the tamper-evident log,
-- and a trace id is operational data, not a fact about the money.
CREATE TABLE transfer_traces (
    req_id      text PRIMARY KEY,
    traceparent text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
