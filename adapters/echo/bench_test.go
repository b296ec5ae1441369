package ceilingecho_test

import (
	"net/http"
	"testing"

	"github.com/ceiling-go/ceiling"
	ceilingecho "github.com/ceiling-go/ceiling/adapters/echo"
	"github.com/ceiling-go/ceiling/internal/adaptertest"
	"github.com/labstack/echo/v4"
)

// BenchmarkEcho is [adaptertest.Bench] on an Echo route.
func BenchmarkEcho(b *testing.B) {
	adaptertest.Bench(b, func(l *ceiling.Limiter) http.Handler {
		e := echo.New()
		if l != nil {
			e.Use(ceilingecho.Middleware(l))
		}
		e.GET("/items/:id", func(c echo.Context) error { return c.NoContent(http.StatusNoContent) })
		return e
	})
}
