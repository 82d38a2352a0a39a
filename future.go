package ferry

import (
	"context"
	"io"
	"iter"
)

// Future is the result of a call that returns at once and completes later, so
// a caller can issue many calls before waiting for any of them.
type Future[T any] struct {
	done chan struct{}
	v    T
	err  error
}

// Go runs fn in a new goroutine and returns a Future for its result.
func Go[T any](fn func() (T, error)) *Future[T] {
	f := &Future[T]{done: make(chan struct{})}
	go func() {
		defer close(f.done)
		f.v, f.err = fn()
	}()
	return f
}

// Resolved returns a Future that is already complete.
func Resolved[T any](v T, err error) *Future[T] {
	f := &Future[T]{done: make(chan struct{}), v: v, err: err}
	close(f.done)
	return f
}

// ErrReader returns a reader whose every Read fails with err: what a Get
// that fails before it reads anything returns (Tree.Get reports errors on
// the first Read).
func ErrReader(err error) io.ReadCloser { return errReader{err} }

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
func (e errReader) Close() error             { return nil }

// Wait blocks until the call completes and returns its result.
func (f *Future[T]) Wait() (T, error) {
	<-f.done
	return f.v, f.err
}

// Done is closed when the call completes; Wait then returns at once.
func (f *Future[T]) Done() <-chan struct{} { return f.done }

// Stream delivers the values of a call as they arrive, then an error. It
// is used by one consumer; a consumer that stops early calls Close, which
// cancels the producer.
type Stream[T any] struct {
	c      chan T
	done   chan struct{}
	err    error
	cancel context.CancelFunc
}

// NewStream runs produce in a new goroutine and returns the Stream it feeds.
// Each send blocks until the consumer takes the value and returns an error
// once the stream is cancelled (by ctx or by Close); produce must then stop.
// What produce returns becomes the stream's Err.
func NewStream[T any](ctx context.Context, produce func(ctx context.Context, send func(T) error) error) *Stream[T] {
	ctx, cancel := context.WithCancel(ctx)
	s := &Stream[T]{c: make(chan T), done: make(chan struct{}), cancel: cancel}
	send := func(v T) error {
		select {
		case s.c <- v:
			return nil
		case <-ctx.Done():
			return E("", "", KindCanceled, ctx.Err())
		}
	}
	go func() {
		err := produce(ctx, send)
		if err == nil && ctx.Err() != nil {
			err = E("", "", KindCanceled, ctx.Err())
		}
		s.err = err
		close(s.done)
		close(s.c)
	}()
	return s
}

// ErrStream returns a Stream that delivers nothing and fails with err.
func ErrStream[T any](err error) *Stream[T] {
	s := &Stream[T]{c: make(chan T), done: make(chan struct{}), err: err, cancel: func() {}}
	close(s.c)
	close(s.done)
	return s
}

// Next returns the next value, or false once the stream has ended; Err then
// tells why.
func (s *Stream[T]) Next() (T, bool) {
	v, ok := <-s.c
	return v, ok
}

// All returns an iterator over the remaining values. Breaking out of the loop
// leaves the stream open; call Close.
func (s *Stream[T]) All() iter.Seq[T] {
	return func(yield func(T) bool) {
		for v := range s.c {
			if !yield(v) {
				return
			}
		}
	}
}

// C returns the channel the values arrive on, closed when the stream ends,
// for a consumer that must also wait for something else (a timer) in a
// select.
func (s *Stream[T]) C() <-chan T { return s.c }

// Err waits for the stream to end and returns nil if it ended normally.
func (s *Stream[T]) Err() error {
	<-s.done
	return s.err
}

// Close cancels the producer, drains what it had in flight and returns Err
// (a stream closed before its end reports KindCanceled).
func (s *Stream[T]) Close() error {
	s.cancel()
	for range s.c {
	}
	return s.Err()
}
