package daemon

import (
	"sync"
	"time"
)

// loopBeats is when each loop last beat: the watchdog's evidence that none is stuck.
type loopBeats struct {
	mu sync.Mutex
	at map[string]time.Time
}
