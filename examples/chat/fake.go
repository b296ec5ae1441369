package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"
)

// Order is what the order lookup finds for a shop's customer.
type Order struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	ETA    string `json:"eta"`
}

// lookupLatency is how long the fake order lookup takes: long enough that
// starting it while the limiter decides saves something.
const lookupLatency = 20 * time.Millisecond

// fakeOrders stands in for the shop's order API: the same shop always gets
// the same order, after latency, unless ctx ends first.
func fakeOrders(latency time.Duration) func(ctx context.Context, shop string) (Order, error) {
	return func(ctx context.Context, shop string) (Order, error) {
		t := time.NewTimer(latency)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return Order{}, fmt.Errorf("order lookup for %s: %w", shop, ctx.Err())
		case <-t.C:
		}
		return orderOf(shop), nil
	}
}

// orderOf is the order the fake lookup finds for shop.
func orderOf(shop string) Order {
	h := fnv.New32a()
	h.Write([]byte(shop))
	n := h.Sum32()
	statuses := [...]string{"being packed", "shipped", "out for delivery"}
	return Order{
		ID:     fmt.Sprintf("#%d", 1000+n%9000),
		Status: statuses[n%uint32(len(statuses))],
		ETA:    fmt.Sprintf("in %d days", 1+n%4),
	}
}

// systemPromptTokens is what the fake model charges for the instructions
// and the order details that go with every message.
const systemPromptTokens = 120

// promptTokens is what a message's prompt costs: the instructions and the
// order, and the message at about four bytes a token (a real service would
// count with the model's tokenizer).
func promptTokens(message string) int64 {
	return systemPromptTokens + int64(len(message)+3)/4
}

// fakeModel stands in for the LLM: a deterministic reply of at most
// maxOutput tokens, and the tokens the call used as a provider reports
// them (prompt plus completion), so the budget can be charged with the real
// cost.
func fakeModel(message string, o Order, maxOutput int64) (reply string, tokens int64) {
	reply = fmt.Sprintf("Your order %s is %s and should arrive %s.", o.ID, o.Status, o.ETA)
	return reply, promptTokens(message) + min(int64(len(reply)+3)/4, maxOutput)
}
