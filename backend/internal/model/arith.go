package model

import (
	"fmt"
	"math"
	"math/big"
)

// Checked int64 arithmetic: the model never wraps around. A panic here is a
// sequence that leaves the bounds ALGORITHMS.md promises exactness within,
// which the differential test reports like any disagreement.

func add(a, b int64) int64 {
	s := a + b
	if (b > 0 && s < a) || (b < 0 && s > a) {
		panic(fmt.Sprintf("model: %d + %d overflows int64", a, b))
	}
	return s
}

func mul(a, b int64) int64 {
	p := new(big.Int).Mul(big.NewInt(a), big.NewInt(b))
	if !p.IsInt64() {
		panic(fmt.Sprintf("model: %d × %d overflows int64", a, b))
	}
	return p.Int64()
}

// floorDiv is floor(a / b) for b > 0, on any sign of a.
func floorDiv(a, b int64) int64 {
	if b <= 0 {
		panic(fmt.Sprintf("model: division by %d", b))
	}
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// floorMod is a - b*floorDiv(a, b), in [0, b).
func floorMod(a, b int64) int64 { return a - b*floorDiv(a, b) }

// ceilDiv is ceil(a / b) for a >= 0, b > 0: (a + b - 1) / b.
func ceilDiv(a, b int64) int64 {
	if a < 0 || b <= 0 || a > math.MaxInt64-b {
		panic(fmt.Sprintf("model: ceil(%d / %d) outside its domain", a, b))
	}
	return (a + b - 1) / b
}

func bigMul(a, b int64) *big.Int { return new(big.Int).Mul(big.NewInt(a), big.NewInt(b)) }

func bigAdd(a, b *big.Int) *big.Int { return new(big.Int).Add(a, b) }

func bigSub(a, b *big.Int) *big.Int { return new(big.Int).Sub(a, b) }
