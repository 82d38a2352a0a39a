package cli

import "testing"

func TestCacheDir(t *testing.T) {
	tests := []struct {
		name, ferryHome, xdgCache, home, want string
	}{
		{"FERRY_HOME holds everything", "/f", "/x", "/h", "/f/cache/host_7077"},
		{"XDG_CACHE_HOME", "", "/x", "/h", "/x/ferry/host_7077"},
		{"the home's .cache", "", "", "/h", "/h/.cache/ferry/host_7077"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("FERRY_HOME", tt.ferryHome)
			t.Setenv("XDG_CACHE_HOME", tt.xdgCache)
			t.Setenv("HOME", tt.home)
			if got := cacheDir("host:7077"); got != tt.want {
				t.Errorf("cacheDir = %q, want %q", got, tt.want)
			}
		})
	}
}
