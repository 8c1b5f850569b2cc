-- What the operations inside the gate's Redis functions cost, one by one, in this Redis: each is
-- run N times in a loop inside one script and timed with TIME (µs per operation). A record like
-- the one request_token.lua writes for a new grant (prelude.lua's slots) is built, packed with
-- cmsgpack, unpacked, stored with SET … PXAT, read with GET; the lease index's ZADD and ZREM, the
-- clock's TIME and load's PEXPIRETIME are timed the same way. Run against a scratch Redis (it
-- writes N keys micro:<i> and a sorted set micro:z), e.g.:
--
--   redis-server --port 6390 --save '' --appendonly no &
--   redis-cli -p 6390 --eval scripts/bench_lua_ops.lua , 5000
--
-- BENCHMARKS.md ("A Python cycle, process by process") quotes it.
local N = tonumber(ARGV[1])
local function clock() local t = redis.call('TIME'); return tonumber(t[1]) * 1e6 + tonumber(t[2]) end
local function rec()
  return { [1] = 1, [2] = 1796299506051001, [3] = 'v1-79fe47929d6db6db44b190c096fa22c74819af5f95c804cb51d4d99a22d57d48',
           [4] = '', [5] = 86400000, [6] = 0, [7] = 0, [8] = 'a4f3c2b1e0d94c8b9a7f6e5d4c3b2a19', [9] = '', [10] = 1796299536051, [11] = {},
           [12] = '', [13] = 0, [14] = 0, [15] = 0, [16] = '', [17] = '', [18] = 'anonymous',
           [23] = 'bench.noop', [24] = '{"order_id":"123-45","amount":100}' }
end
local out = {}
local t0 = clock()
for i = 1, N do local r = rec() end
local t1 = clock(); table.insert(out, 'new_record ' .. (t1 - t0) / N)
local packed
for i = 1, N do packed = cmsgpack.pack(rec()) end
local t2 = clock(); table.insert(out, 'new+pack ' .. (t2 - t1) / N .. ' bytes ' .. #packed)
for i = 1, N do local r = cmsgpack.unpack(packed) end
local t3 = clock(); table.insert(out, 'unpack ' .. (t3 - t2) / N)
for i = 1, N do redis.call('SET', 'micro:' .. i, packed, 'PXAT', 1896299536051) end
local t4 = clock(); table.insert(out, 'SET PXAT ' .. (t4 - t3) / N)
for i = 1, N do local r = redis.call('GET', 'micro:' .. i) end
local t5 = clock(); table.insert(out, 'GET ' .. (t5 - t4) / N)
for i = 1, N do redis.call('ZADD', 'micro:z', 1796299536051 + i, 'member-' .. i) end
local t6 = clock(); table.insert(out, 'ZADD ' .. (t6 - t5) / N)
for i = 1, N do redis.call('ZREM', 'micro:z', 'member-' .. i) end
local t7 = clock(); table.insert(out, 'ZREM ' .. (t7 - t6) / N)
for i = 1, N do local t = redis.call('TIME') end
local t8 = clock(); table.insert(out, 'TIME ' .. (t8 - t7) / N)
for i = 1, N do redis.call('PEXPIRETIME', 'micro:' .. i) end
local t9 = clock(); table.insert(out, 'PEXPIRETIME ' .. (t9 - t8) / N)
for i = 1, N do local x = { 1796299506, 'granted', 1, 'a4f3c2b1e0d94c8b9a7f6e5d4c3b2a19', 1796299506051001, 1796299536051 } end
local t10 = clock(); table.insert(out, 'reply table ' .. (t10 - t9) / N)
return out
