-- POST one fixed body, read from a file, on every request; print a JSON summary at the end.
-- usage: wrk -s bench/post.lua URL -- BODY_FILE CONTENT_TYPE [METHOD]
-- With METHOD GET the body is not sent and CONTENT_TYPE is what the request accepts.

function init(args)
  local f = assert(io.open(args[1], "rb"))
  wrk.body = f:read("*a")
  f:close()
  wrk.method = args[3] or "POST"
  if wrk.method == "GET" then
    wrk.body = nil
    wrk.headers["Accept"] = args[2]
  else
    wrk.headers["Content-Type"] = args[2]
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "bytes": %d, "connect": %d, "read": %d, '
      .. '"write": %d, "status": %d, "timeout": %d, "lat_p50_us": %d, "lat_p99_us": %d, '
      .. '"lat_max_us": %d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(99), latency.max))
end
