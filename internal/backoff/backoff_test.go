package backoff_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cgledger/cgledger/internal/backoff"
)

func TestDelaysDoubleUpToTheCap(t *testing.T) {
	d := backoff.New(time.Millisecond, 5*time.Millisecond)
	var got []time.Duration
	for range 5 {
		got = append(got, d.Next())
		if err := d.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	want := []time.Duration{time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, 5 * time.Millisecond, 5 * time.Millisecond}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("delays %v, want %v", got, want)
		}
	}
}

func TestWaitEndsWithTheContext(t *testing.T) {
	d := backoff.New(time.Hour, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait on a canceled context: %v", err)
	}
}

func TestWaitUntilStopsAtTheDeadline(t *testing.T) {
	d := backoff.New(time.Hour, time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.WaitUntil(ctx, time.Now()); err != nil {
		t.Fatalf("a wait until now did not end before the minute: %v", err)
	}
	if d.Next() != time.Hour {
		t.Fatalf("next delay %v, want the cap", d.Next())
	}
}
