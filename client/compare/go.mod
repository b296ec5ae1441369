module github.com/ceiling-go/ceiling/client/compare

go 1.26.0

require (
	github.com/ceiling-go/ceiling v0.0.0
	github.com/hashicorp/go-retryablehttp v0.7.8
)

require (
	github.com/golang-jwt/jwt/v5 v5.3.1 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
)

replace github.com/ceiling-go/ceiling => ../..
