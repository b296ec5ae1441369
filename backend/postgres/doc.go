// Package postgres is a ceiling backend on PostgreSQL.
package postgres
