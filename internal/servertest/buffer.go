package servertest

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer that a logger and a test may share: a test
// reads what a server or client logged while it still runs.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
