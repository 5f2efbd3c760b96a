package projector

import "github.com/cgledger/cgledger/internal/lru"

// maxCachedStories bounds the cache of cs rows known to be written. A
// call's entries follow each other closely, so the recent calls are the
// ones whose next entry would write the same row again.
const maxCachedStories = 32768

// storyKnown reports whether the cs row with key k is known to be committed.
// A miss only costs a rewrite of the same row.
func (s *Store) storyKnown(k string) bool {
	_, ok := s.stories.Get(k)
	return ok
}

// noteStories records cs rows a committed batch wrote.
func (s *Store) noteStories(m map[string]struct{}) { s.stories.PutAll(m) }

func newStoryCache(max int) *lru.Cache[struct{}] { return lru.New[struct{}](max) }
