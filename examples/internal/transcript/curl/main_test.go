package main

import "testing"

func TestCurlStandInRefusesWhatItDoesNotKnow(t *testing.T) {
	for _, args := range [][]string{
		{"-L", "localhost:1/"},
		{"--compressed", "localhost:1/"},
		{"-w", "%{time_total}", "localhost:1/"},
		{"-o", "out.txt", "localhost:1/"},
		{"localhost:1/a", "localhost:1/b"},
		{"-s"},
	} {
		if _, err := parse(args); err == nil {
			t.Errorf("parse(%q) accepted options the stand-in does not implement", args)
		}
	}
}
