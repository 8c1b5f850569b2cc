-- The limit `make bench` compares the gate with: the least one grant can cost in Redis, run by
-- redis-benchmark as EVALSHA (loaded once with SCRIPT LOAD). Equivalent to one grant: SET NX with
-- an expiry (the record) plus a counter (the fencing number), in one atomic script call.
-- KEYS[1]: the record key (redis-benchmark puts a random number in it: -r, __rand_int__)
-- KEYS[2]: the counter key (random as well)
-- ARGV[1]: the value (stands for a token)
-- ARGV[2]: the expiry in ms
-- Returns: the counter's new value; 0 when the record key already existed (a random collision)
local set = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
local fencing = redis.call('INCR', KEYS[2])
if set then
  return fencing
end
return 0
