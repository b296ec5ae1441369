package ceilinggin_test

import (
	"net/http"
	"testing"

	"github.com/ceiling-go/ceiling"
	ceilinggin "github.com/ceiling-go/ceiling/adapters/gin"
	"github.com/ceiling-go/ceiling/internal/adaptertest"
	"github.com/gin-gonic/gin"
)

// BenchmarkGin is [adaptertest.Bench] on a Gin route.
func BenchmarkGin(b *testing.B) {
	adaptertest.Bench(b, func(l *ceiling.Limiter) http.Handler {
		r := gin.New()
		if l != nil {
			r.Use(ceilinggin.Middleware(l))
		}
		r.GET("/items/:id", func(c *gin.Context) { c.Status(http.StatusNoContent) })
		return r
	})
}
