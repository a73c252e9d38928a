package compare

// ForgetRequests empties the cache of the traces' requests.
func ForgetRequests() {
	requestCache.Lock()
	requestCache.entries = nil
	requestCache.Unlock()
}
