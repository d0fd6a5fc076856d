package cli

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	yaml "go.yaml.in/yaml/v3"
)

// maxYAMLNodes bounds alias expansion (a "billion laughs" file).
const maxYAMLNodes = 1 << 20

// SpecJSON converts one YAML document of a spec file to JSON by YAML 1.2's
// core schema: only true and false are booleans, so `name: y` or
// `name: on` stay the strings they were typed as (YAML 1.1, which
// sigs.k8s.io/yaml follows, reads them as booleans). A key given twice is
// an error naming it, as the daemon refuses one in JSON.
func SpecJSON(doc []byte) ([]byte, error) {
	var n yaml.Node
	if err := yaml.Unmarshal(doc, &n); err != nil {
		return nil, err
	}
	budget := maxYAMLNodes
	v, err := nodeValue(&n, "", &budget)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

func nodeValue(n *yaml.Node, path string, budget *int) (any, error) {
	if *budget--; *budget < 0 {
		return nil, fmt.Errorf("document too large (more than %d values after expanding aliases)", maxYAMLNodes)
	}
	at := func(format string, args ...any) error {
		msg := fmt.Sprintf(format, args...)
		if path != "" {
			msg = path + ": " + msg
		}
		return fmt.Errorf("line %d: %s", n.Line, msg)
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil, nil
		}
		return nodeValue(n.Content[0], path, budget)
	case yaml.AliasNode:
		return nodeValue(n.Alias, path, budget)
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for i, c := range n.Content {
			v, err := nodeValue(c, path+"["+strconv.Itoa(i)+"]", budget)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case yaml.MappingNode:
		out := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, vn := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return nil, at("a key must be a plain value")
			}
			if k.Tag == "!!merge" {
				return nil, at("merge keys (<<) are not supported in spec files")
			}
			kp := k.Value
			if path != "" {
				kp = path + "." + k.Value
			}
			if _, dup := out[k.Value]; dup {
				return nil, fmt.Errorf("line %d: %s: key given more than once", k.Line, kp)
			}
			v, err := nodeValue(vn, kp, budget)
			if err != nil {
				return nil, err
			}
			out[k.Value] = v
		}
		return out, nil
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return nil, nil
		case "!!bool":
			switch n.Value {
			case "true", "True", "TRUE":
				return true, nil
			case "false", "False", "FALSE":
				return false, nil
			}
			return n.Value, nil
		case "!!int":
			if i, err := strconv.ParseInt(n.Value, 0, 64); err == nil {
				return i, nil
			}
			return json.Number(n.Value), nil
		case "!!float":
			f, err := strconv.ParseFloat(n.Value, 64)
			if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
				return n.Value, nil // .inf, .nan: no JSON number; the daemon says what it wants
			}
			return f, nil
		default:
			return n.Value, nil
		}
	}
	return nil, at("unsupported YAML node")
}
