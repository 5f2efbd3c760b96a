package projector

import (
	"bytes"

	"github.com/cockroachdb/pebble/v2"
)

// viewsComparer orders keys bytewise, as Pebble's default does, and splits
// the keys of the rows that queries read as a group (a turn's tl rows, a
// call's st and cs rows, a card's versions) into that group's prefix and
// the rest. Pebble builds its bloom filters over the prefix, so a query
// that seeks to one group (scanGroup) skips every sstable that holds none
// of it instead of reading a block of each level of the LSM: once the views
// outgrow the block cache, that is one block read from disk per group
// instead of one per level.
//
// The prefix is always whole parts ending before a 0x00 separator, and
// parts before it are identifiers (never 0x00), so prefix order is key
// order as Pebble requires (base.Split). Its name is part of the store's
// format: Pebble refuses to open a store written with another comparer
// (format 1 used the default one; OpenStore then rebuilds it).
var viewsComparer = func() *pebble.Comparer {
	c := *pebble.DefaultComparer
	c.Split = splitViewKey
	c.Name = "cgledger.views.v2"
	return &c
}()

// splitViewKey returns the length of k's group prefix, or len(k) for rows
// that are not read by group (their bloom filters cover the whole key, as
// with the default comparer).
func splitViewKey(k []byte) int {
	i := bytes.IndexByte(k, 0)
	if i < 0 {
		return len(k)
	}
	var parts int
	switch string(k[:i]) {
	case tagTimeline, tagStory, tagCard:
		parts = 2 // project and turn; project and call; project and card
	case tagState:
		parts = 3 // project, turn and call
	default:
		return len(k)
	}
	for ; parts > 0; parts-- {
		j := bytes.IndexByte(k[i+1:], 0)
		if j < 0 {
			return len(k)
		}
		i += 1 + j
	}
	return i
}
