module github.com/ceiling-go/ceiling/examples

go 1.26.0

require (
	github.com/ceiling-go/ceiling v0.0.0
	github.com/golang-jwt/jwt/v5 v5.3.1
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

replace github.com/ceiling-go/ceiling => ..
