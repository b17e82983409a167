package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The health statuses Argo CD accepts from a script; anything else is Unknown.
var validHealth = map[string]bool{
	"Healthy": true, "Progressing": true, "Degraded": true,
	"Suspended": true, "Missing": true, "Unknown": true,
}

// argoHealth runs a custom health script as Argo CD's util/lua does for a
// resource.customizations.health entry without useOpenLibs: a fresh VM
// without the standard libraries except package, base, table and a safe os
// (no string, io or debug), a 1-second timeout, the object as the global
// `obj`, and the returned table read as {status, message}.
func argoHealth(obj *unstructured.Unstructured, script string) (*Verdict, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.OsLibName, openSafeOs},
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", toLua(l, obj.Object))
	if err := l.DoString(script); err != nil {
		return nil, err
	}
	ret := l.Get(-1)
	table, ok := ret.(*lua.LTable)
	if !ok {
		return nil, fmt.Errorf("expect table output from Lua script, not %s", ret.Type())
	}
	status := lua.LVAsString(table.RawGetString("status"))
	message := lua.LVAsString(table.RawGetString("message"))
	if !validHealth[status] {
		return &Verdict{Status: "Unknown", Message: "Lua returned an invalid health status"}, nil
	}
	return &Verdict{Status: status, Message: message}, nil
}

// openSafeOs is Argo CD's "safe" os library: time and date only.
func openSafeOs(l *lua.LState) int {
	mod := l.RegisterModule(lua.OsLibName, map[string]lua.LGFunction{
		"time": osTime,
		"date": osDate,
	})
	l.Push(mod)
	return 1
}

func osTime(l *lua.LState) int {
	l.Push(lua.LNumber(time.Now().Unix()))
	return 1
}

func osDate(l *lua.LState) int {
	l.Push(lua.LString(time.Now().UTC().Format(time.RFC3339)))
	return 1
}

// toLua converts a decoded object the way Argo CD's decodeValue does: maps
// to tables, slices to arrays, numbers (float64, int64, json.Number as a
// string) and strings as themselves, anything else nil.
func toLua(l *lua.LState, value interface{}) lua.LValue {
	switch v := value.(type) {
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case int:
		return lua.LNumber(v)
	case int32:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case json.Number:
		return lua.LString(v)
	case string:
		return lua.LString(v)
	case []interface{}:
		arr := l.CreateTable(len(v), 0)
		for _, item := range v {
			arr.Append(toLua(l, item))
		}
		return arr
	case map[string]interface{}:
		tbl := l.CreateTable(0, len(v))
		for key, item := range v {
			tbl.RawSetH(lua.LString(key), toLua(l, item))
		}
		return tbl
	}
	return lua.LNil
}
