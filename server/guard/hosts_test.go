package guard

import "testing"

func TestHostAllowed(t *testing.T) {
	allowed := []string{"box.lan"}
	for host, want := range map[string]bool{
		"127.0.0.1:8080": true, "localhost:8080": true, "LOCALHOST.": true, "ui.localhost:8080": true,
		"[::1]:8080": true, "127.9.9.9": true, "box.lan:8080": true, "BOX.LAN": true,
		"rebind.evil.example:8080": false, "10.0.0.1:8080": false, "localhost.evil.example": false, "": false,
	} {
		if got := hostAllowed(host, allowed); got != want {
			t.Errorf("hostAllowed(%q) = %v, want %v", host, got, want)
		}
	}
	for addr, want := range map[string]bool{"127.0.0.1:8080": true, "localhost:0": true, "[::1]:1": true, "0.0.0.0:8080": false, ":8080": false, "nope": false} {
		if got := Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
