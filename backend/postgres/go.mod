module github.com/ceiling-go/ceiling/backend/postgres

go 1.26.0

replace github.com/ceiling-go/ceiling => ../..

require (
	github.com/ceiling-go/ceiling v0.0.0-00010101000000-000000000000
	github.com/jackc/pgx/v5 v5.12.0
)

require (
	github.com/golang-jwt/jwt/v5 v5.3.1 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)
