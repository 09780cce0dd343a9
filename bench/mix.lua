-- wrk script for `make bench`: a rotating mix of AdmissionReview bodies, closed loop or paced.
--
--   BENCH_RESULT=out.json wrk -t1 -c32 -d8s -s bench/mix.lua https://127.0.0.1:8443 -- MANIFEST [RATE THREADS]
--
-- MANIFEST: lines `path<TAB>file` (gpu_stack_dev.bench.bodies writes them); each thread starts at a different
-- body and rotates through all of them. Every occurrence of SERIAL (bodies.SERIAL_MARK, 12 characters:
-- the end of the request uid, and on /validate of the pod's name and uid) is replaced on each send by
-- a 12-digit serial (thread id, a per-run start from the clock, a counter), so no two requests of a
-- run carry the same uid or name, as from an API server; a body without it is sent as it is.
-- RATE (requests/s, whole run; 0 or absent = closed loop) and THREADS (wrk's -t): every thread keeps a
-- fixed schedule of send times (RATE / THREADS per thread, evenly spaced) and a connection that becomes free claims the next
-- slot and sleeps until it (wrk's delay()). wrk starts its latency clock when the request is written,
-- so a send that happens after its slot (every connection was busy: coordinated omission) would hide
-- queueing: such sends are counted as `late` with the worst lateness, and the runner reports them.
-- $BENCH_RESULT: a file to write the summary to as JSON (default: stdout).

local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
]]
local CLOCK_MONOTONIC = 1
local ts = ffi.new("bench_timespec")
local function now_ms()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end

local threads = {}
local counter = 0

function setup(thread)
  counter = counter + 1
  thread:set("id", counter)
  table.insert(threads, thread)
end

local SERIAL = "serialnumber"
local requests = {}  -- each: the formatted request cut at every SERIAL (one piece: no SERIAL)
local index = 0
local serial = 0
local interval = 0   -- ms between sends of this thread; 0: closed loop
local nthreads = 1
local start = nil
local slot = 0
late, worst_late_ms = 0, 0

function split(text)
  local pieces, start = {}, 1
  while true do
    local i, j = text:find(SERIAL, start, true)
    if not i then
      table.insert(pieces, text:sub(start))
      return pieces
    end
    table.insert(pieces, text:sub(start, i - 1))
    start = j + 1
  end
end

function init(args)
  local manifest = args[1]
  local rate = tonumber(args[2] or "0") or 0
  local f = assert(io.open(manifest, "r"))
  for line in f:lines() do
    local path, file = line:match("^(%S+)\t(.+)$")
    if path then
      local bf = assert(io.open(file, "rb"))
      local body = bf:read("*a")
      bf:close()
      table.insert(requests, split(wrk.format("POST", path, { ["Content-Type"] = "application/json" }, body)))
    end
  end
  f:close()
  assert(#requests > 0, "no request bodies in " .. manifest)
  index = (id or 1) - 1
  -- 2 digits of thread, 10 of serial (modulo 10^10, so always 12 digits): a per-run start from the clock.
  serial = (os.time() % 99999) * 100000
  nthreads = tonumber(args[3] or "1") or 1
  if rate > 0 then
    interval = 1000.0 * nthreads / rate
  end
end

function delay()
  if interval == 0 then
    return 0
  end
  local now = now_ms()
  if start == nil then
    -- The schedule starts 500 ms after the first connection is up, so every connection has done its
    -- TLS handshake before the first paced send (no handshake storm in the measured latencies); the
    -- threads' schedules are staggered so they interleave instead of sending together.
    start = now + 500 + interval * ((id or 1) - 1) / nthreads
  end
  local due = start + slot * interval
  slot = slot + 1
  local wait = due - now
  if wait < -1 then
    late = late + 1
    if -wait > worst_late_ms then
      worst_late_ms = -wait
    end
  end
  if wait <= 0 then
    return 0
  end
  return math.floor(wait + 0.5)
end

function request()
  index = index % #requests + 1
  local pieces = requests[index]
  if #pieces == 1 then
    return pieces[1]
  end
  serial = serial + 1
  return table.concat(pieces, string.format("%02d%010d", (id or 1) % 100, serial % 10000000000))
end

function done(summary, latency, requests_stats)
  local total_late, worst = 0, 0
  for _, t in ipairs(threads) do
    total_late = total_late + (t:get("late") or 0)
    worst = math.max(worst, t:get("worst_late_ms") or 0)
  end
  local e = summary.errors
  local out = string.format(
    '{"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"min":%d,"mean":%.1f,"max":%d,"p50":%d,"p90":%d,"p99":%d,"p999":%d},' ..
    '"late":%d,"worst_late_ms":%.2f}',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency.max,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
    total_late, worst)
  local result = os.getenv("BENCH_RESULT")
  if result and result ~= "" then
    local f = assert(io.open(result, "w"))
    f:write(out, "\n")
    f:close()
  else
    io.write(out, "\n")
  end
end
