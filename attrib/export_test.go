package attrib

// SetWalkLimit sets how many events c walks to a later boundary before it
// reads the layout there instead.
func SetWalkLimit(c *Categorizer, n int64) { c.walkLimit = n }
