//go:build !ceilingci

package citest

const enabled = false
