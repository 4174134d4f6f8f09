-- wrk script for `ledger-bench transfers --wrk`: transfers as a client would send them, signed
-- in as many users, each user alternating FUNDING->SPOT and SPOT->FUNDING (1 USDT).
--
-- Usage: wrk -t2 -c32 -d15s -s bench/wrk/transfers.lua http://HOST:PORT -- TOKENS_FILE 2
-- (the last argument repeats wrk's thread count, which the script cannot read itself).
-- TOKENS_FILE holds one pre-minted bearer token per line, one line per user; every user's
-- FUNDING account must hold money first. The users are split between wrk's threads (thread i
-- takes lines i, i+T, ...) and each thread takes its users in turn, so one user's transfers never
-- overlap while there are many more users than connections.
-- The last line printed is machine-readable for ledger-bench:
-- WRK_RESULT requests=<n> duration_us=<n> committed=<n> other=<n> errors=<n> p50_us=<n> p99_us=<n>

local threads = {}
local next_id = 0

function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

local tokens = {}
local to_spot = {}
local turn = 0
committed = 0
other = 0

function init(args)
  local path = args[1]
  if path == nil then
    error("usage: ... -- TOKENS_FILE THREADS")
  end
  local nthreads = tonumber(args[2]) or 1
  local all = {}
  for line in io.lines(path) do
    if line ~= "" then
      table.insert(all, line)
    end
  end
  for i, token in ipairs(all) do
    if (i - 1) % nthreads == id then
      table.insert(tokens, token)
      table.insert(to_spot, true)
    end
  end
  if #tokens == 0 then
    error("no tokens for thread " .. id)
  end
end

function request()
  turn = turn % #tokens + 1
  local body
  if to_spot[turn] then
    body = '{"from":"FUNDING","to":"SPOT","asset":"USDT","amount":"1"}'
  else
    body = '{"from":"SPOT","to":"FUNDING","asset":"USDT","amount":"1"}'
  end
  to_spot[turn] = not to_spot[turn]
  local headers = {
    ["Authorization"] = "Bearer " .. tokens[turn],
    ["Content-Type"] = "application/json",
  }
  return wrk.format("POST", "/api/v1/internal_transfer", headers, body)
end

function response(status, headers, body)
  if status == 200 and string.find(body, '"COMMITTED"', 1, true) then
    committed = committed + 1
  else
    other = other + 1
  end
end

function done(summary, latency, requests)
  local c, o = 0, 0
  for _, thread in ipairs(threads) do
    c = c + thread:get("committed")
    o = o + thread:get("other")
  end
  local e = summary.errors
  local errors = e.connect + e.read + e.write + e.status + e.timeout
  io.write(string.format(
    "WRK_RESULT requests=%d duration_us=%d committed=%d other=%d errors=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.duration, c, o, errors,
    latency:percentile(50), latency:percentile(99)))
end
