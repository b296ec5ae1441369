-- exactDiv is floor(a / b) for integers a >= 0, b > 0, exact: the double
-- quotient can round up to the next integer when a/b is just below it (see
-- decide.lua's fdiv). The scripts of one request that divide (gcra.lua,
-- rolling.lua) share it: it comes first in every script built from them.
local exactFloor = math.floor
local function exactDiv(a, b)
  local q = exactFloor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

